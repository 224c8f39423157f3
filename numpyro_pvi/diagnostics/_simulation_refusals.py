"""What no data set simulated from the prior honours, refused by name with
a remedy: the procedures on simulated data sets (VSBC, the predictive
calibration) draw the latents from the sample sites' distributions and the
outcomes from the observed sites' samplers."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from numpyro_pvi._core import censoring_refusal, imputed_entries


def refuse_imputed(
    model: Callable, args: tuple, kwargs: dict, dependent: list[str], function: str
) -> None:
    """Raise where an observed site fills missing entries of its data with
    latent draws (:func:`~numpyro_pvi._core.imputed.imputed_entries`), as
    ``obs_mask=`` does: the procedures simulate complete data sets."""
    imputed = imputed_entries(model, args, kwargs, dependent) if dependent else {}
    for name, entries in (imputed or {}).items():
        raise ValueError(
            f"{function}: the model's site '{name}' fills {int(entries.sum())} "
            "missing entries of its data with latent draws (imputed values), "
            f"and {function} simulates complete data sets, which the "
            "imputation does not describe. Check the fitting procedure on the "
            "model of complete data (without the imputed site), and this fit "
            "with diagnostics.psis and predictive_score, which take it."
        )


def refuse_density_terms(dependent: list[str], function: str) -> None:
    """Raise, naming the site, at an observed site whose value is computed
    from the latent draws when the procedure draws the latents from the
    prior: like a ``numpyro.factor``, it is a term of the joint density that
    the prior's draws do not see, so neither those draws nor the data sets
    simulated from them would be the model's (an exact fit would look
    miscalibrated)."""
    for name in dependent:
        instead = (
            ", or pass replications=Replications(data_generator=...) (data "
            "sets from a process of your own: no prior draws are needed, and "
            "the fits keep the term)"
            if function == "predictive_calibration"
            else ""
        )
        raise ValueError(
            f"{function}: the observed site '{name}' observes a value computed "
            "from the latent draws (a prior written as an observed site, or a "
            "residual such as obs=y - mu), a term of the model's log density "
            f"that no draw simulates: {function} draws the latents from the "
            "sample sites' priors, which do not see it, so those draws and the "
            "data sets simulated from them would not be the model's, and an "
            "exact fit would look miscalibrated. Write the term into the "
            "distributions (the latent site's own prior; dist.Normal(mu, "
            "sigma), obs=y rather than dist.Normal(0, sigma), obs=y - mu)"
            f"{instead}. diagnostics.psis checks a fit of the model as it is."
        )


def refuse_tempered_priors(model_trace: dict, function: str) -> None:
    """Raise, naming the site, at a latent site with a handler scale other
    than 1 (``numpyro.handlers.scale`` on a prior, as in consensus Monte
    Carlo's subposteriors): its density is the tempered prior
    p(theta)^s, whose draws are not the distribution's."""
    for name, site in model_trace.items():
        if site["type"] == "sample" and not site["is_observed"] and site["tempered"]:
            instead = (
                ", or pass replications=Replications(data_generator=...) (data "
                "sets from a process of your own: no prior draws are needed)"
                if function == "predictive_calibration"
                else ""
            )
            raise ValueError(
                f"{function}: the latent site '{name}' has a handler scale "
                "(numpyro.handlers.scale) other than 1, so the model's prior "
                "density is the tempered p(theta)^scale, while "
                f"{function} draws the latents from the site's distribution: "
                "those draws and the data sets simulated from them would not "
                "be the model's, and an exact fit would look miscalibrated. "
                "Call it with the model's prior unscaled (scale=1), or give "
                f"the site the prior the scale stands for{instead}."
            )


#: Why a procedure on simulated data sets cannot take a censored likelihood,
#: and what works instead.
_CENSORED_REMEDY = {
    "vsbc": "VSBC fits data sets simulated with that sampler, which are not "
    "data sets of the model. Run vsbc on the model with the uncensored "
    "likelihood (the censored distribution's base_dist): it checks the same "
    "fitting procedure on complete data.",
    "predictive_calibration": "The PIT ranks each observation among "
    "simulated outcomes, which would be wrong here whatever simulates the "
    "data sets. Compare fits by their held-out log score instead "
    "(cross_validate, predictive_score), or run predictive_calibration on the "
    "model with the uncensored likelihood (the censored distribution's "
    "base_dist).",
}


def refuse_censored(model_trace: dict, function: str) -> None:
    """Raise, naming the site, when an observed site is censored."""
    for name, site in model_trace.items():
        family = site["fn"].censored if site["type"] == "sample" else None
        if site["is_observed"] and family is not None:
            raise ValueError(
                f"{function}: {censoring_refusal(name, family)} "
                + _CENSORED_REMEDY[function]
            )


def refuse_factors(
    model_trace: dict, observed: Sequence[str], function: str, prior_draws: bool
) -> None:
    """Raise, naming the site, at a ``numpyro.factor`` that the simulated data
    sets cannot honour: one in a plate among the data (a likelihood term,
    no outcome to simulate), or any other when it is simulated or the
    procedure draws the latents from the prior (the draws do not see it)."""
    for name, site in model_trace.items():
        if site["type"] != "sample" or not site["fn"].factor:
            continue
        if name in observed and site["cond_indep_stack"]:
            raise ValueError(
                f"{function}: the observed site '{name}' is a numpyro.factor, "
                "a term of the log density with no outcome to simulate, so the "
                "model has no simulated data sets. Write the likelihood as an "
                "observed sample site (numpyro.sample(name, distribution, "
                "obs=y)), whose outcomes it simulates."
            )
        if name in observed or prior_draws:
            instead = (
                ", or pass replications=Replications(data_generator=...) "
                "(data sets from a process of your own: no prior draws are "
                "needed)"
                if function == "predictive_calibration" and name not in observed
                else ""
            )
            raise ValueError(
                f"{function}: the model's numpyro.factor site '{name}' is a "
                "term of its log density that no draw simulates: draws from "
                "the sample sites' priors do not see it, so the simulated data "
                "sets would not be the model's. Write that term as the "
                "distribution of a sample site (an observed one for a "
                f"likelihood){instead}."
            )


def refuse_unsampled(model_trace: dict, observed: Sequence[str], function: str) -> None:
    """Raise, naming the site, when an observed site's distribution has no
    sampler: the procedure simulates its outcomes."""
    for name in observed:
        why = model_trace[name]["fn"].unsampled
        if why is not None:
            instead = (
                ", or pass replications=Replications(data_generator=...) "
                "(data sets from a process of your own)"
                if function == "predictive_calibration"
                else ""
            )
            raise ValueError(
                f"{function}: the observed site '{name}' cannot be simulated: "
                f"{why}; and {function} simulates data sets of the model. Give "
                f"its distribution a sampler that draws{instead}."
            )
