"""A corpus of real NumPyro programs, the model and guide code as written.

Each module takes one program from NumPyro's own examples, documentation
notebooks or test suite (``SOURCE`` says where, at the commit read), keeps
its model (and guide, where it has one) verbatim, and replaces the data by
simulated data of the same shapes and dtypes (no downloads). A module
defines:

- ``SOURCE``: where the code comes from;
- ``model`` and ``make_guide(model)``;
- ``data(seed)`` and ``held_out(seed)``: ``(args, kwargs)`` for the model
  (``held_out`` may be ``None`` when the program closes over its data);
- ``TRAITS``: what the program exercises (no plate, Python on its
  arguments, improper priors, ...), for the reader.

The package must work on them as written: a program that needs a change
to its model is a defect of the package, not of the program.
"""

from tests.programs import (
    annotation,
    baseball,
    bayesian_imputation,
    bayesian_regression,
    beta_bernoulli,
    bnn,
    german_credit,
    gmm,
    hierarchical_regression,
    hmcecs_logistic,
    hmm_enum,
    ordinal_regression,
    time_series_forecasting,
    toy_mixture,
    ucbadmit,
    zero_inflated_poisson,
)

PROGRAMS = {
    module.__name__.rsplit(".", 1)[1]: module
    for module in (
        bnn,
        zero_inflated_poisson,
        hmcecs_logistic,
        bayesian_regression,
        hierarchical_regression,
        german_credit,
        ordinal_regression,
        beta_bernoulli,
        ucbadmit,
        baseball,
        bayesian_imputation,
        time_series_forecasting,
        toy_mixture,
        gmm,
        hmm_enum,
        annotation,
    )
}
