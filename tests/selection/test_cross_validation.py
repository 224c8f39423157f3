"""Cross-validated choice of the objective (``numpyro_pvi.selection``)."""

import os
import signal
import threading
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from jax import random
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal
from numpyro.infer.util import log_density

from numpyro_pvi import FitRecipe, PredictiveELBO, StratifiedELBO, predictive_score
from numpyro_pvi.guides import AutoGaussianMixture
from numpyro_pvi.objectives.svi_scan import svi_scan
from numpyro_pvi.selection import (
    CrossValidation,
    _held_out_scores,
    _programs,
    cross_validate,
    default_candidates,
    mask_observations,
    plot_cross_validation,
)
from numpyro_pvi.selection.fold_ids import fold_ids

N = 24


def one_site(y):
    theta = numpyro.sample("theta", dist.Normal(0.0, 3.0))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)


def two_sites(y):
    """Two observed sites per observation, on scales a factor 20 apart."""
    theta = numpyro.sample("theta", dist.Normal(0.0, 3.0))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("a", dist.Normal(theta, 1.0), obs=y[:, 0])
        numpyro.sample("b", dist.Normal(20.0 * theta, 20.0), obs=y[:, 1])


def local_latent(y):
    """A local latent per observation: a fold-out observation's is predicted
    from the guide's factor for it."""
    theta = numpyro.sample("theta", dist.Normal(0.0, 3.0))
    with numpyro.plate("obs", y.shape[0]):
        z = numpyro.sample("z", dist.Normal(theta, 1.0))
        numpyro.sample("y", dist.Normal(z, 0.5), obs=y)


def subsampled(y, batch=8):
    theta = numpyro.sample("theta", dist.Normal(0.0, 3.0))
    with numpyro.plate("obs", y.shape[0], subsample_size=batch) as idx:
        numpyro.sample("y", dist.Normal(theta, 1.0), obs=y[idx])


def _data(model, seed=0, n=N, *, outlier=False):
    """Data of ``model``; with ``outlier`` the first observation is 300 sd
    away from the others (far from any guide fitted to them)."""
    rng = np.random.default_rng(seed)
    y = 1.0 + 2.0 * rng.standard_normal((n, 2) if model is two_sites else n)
    if outlier:
        y[0] = 600.0
    return jnp.asarray(y, jnp.result_type(float))


CANDIDATES = {
    "VI": Trace_ELBO(num_particles=4),
    "prior lam=0.1": PredictiveELBO(num_particles=4, lam=0.1),
    "prior lam=1": PredictiveELBO(num_particles=4, lam=1.0),
    # with the prior ones: one program for both regularizers' grids
    "posterior lam=1": PredictiveELBO(
        num_particles=4, regularizer="posterior", lam=1.0
    ),
}
STEPS, DRAWS = 30, 64


def _cv(model, y, **kw):
    options = dict(candidates=CANDIDATES, num_folds=4)
    return cross_validate(
        random.PRNGKey(1),
        model,
        AutoNormal(model),
        optax.adam(0.05),
        y,
        fit=FitRecipe(num_steps=STEPS, num_draws=DRAWS, progress_bar=False),
        **{**options, **kw},
    )


@pytest.mark.parametrize(
    "num_fits, terms", [(35, 30_000), (35, 1_000), (5, 10), (1, 1)]
)
def test_fit_layout_covers_every_fit_once(num_fits, terms, monkeypatch):
    """The chunks of a grid's fits hold every fit once, in order, padded with
    the last; batches divide the chunks; large fits run one at a time."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    layout = _programs.FitLayout.of(num_fits, terms)
    assert layout.chunks == min(2, num_fits)
    assert layout.per_chunk % layout.batch == 0
    small = terms <= _programs.BATCH_TERMS // 4  # these: one batch per chunk
    assert layout.batch == (layout.per_chunk if small else 1)
    rows = np.concatenate(
        [layout.chunk(np.arange(num_fits), c) for c in range(layout.chunks)]
    )
    np.testing.assert_array_equal(rows[:num_fits], np.arange(num_fits))
    assert (rows[num_fits:] == num_fits - 1).all()
    assert len(rows) - num_fits < layout.chunks * layout.batch
    # on an accelerator, one batch of every fit
    assert _programs.FitLayout.of(num_fits, terms, cpu=False) == (
        num_fits,
        1,
        num_fits,
        num_fits,
    )


def test_folds_partition_the_data_plate():
    for n, k in [(10, 3), (24, 4), (7, 7), (101, 5)]:
        folds = np.asarray(fold_ids(random.PRNGKey(n), n, k))
        assert folds.shape == (n,)
        counts = np.bincount(folds, minlength=k)
        assert counts.sum() == n and counts.max() - counts.min() <= 1
        assert set(folds.tolist()) == set(range(k))


@pytest.mark.parametrize("model", [one_site, two_sites])
def test_mask_equals_the_kept_data(model):
    """The masked model's log density is the model's on the kept data only."""
    y = _data(model)
    keep = np.arange(N) % 3 != 0
    params = {"theta": jnp.asarray(0.7)}
    masked = mask_observations(model, keep=keep, data_plate="obs")
    full, _ = log_density(masked, (y,), {}, params)
    kept, _ = log_density(model, (y[keep],), {}, params)
    np.testing.assert_allclose(full, kept, rtol=1e-6)


def test_mask_with_a_subsampled_plate_is_unbiased():
    """Subsampled: the mean over subsamples of the masked log-likelihood is the
    kept data's (the subsample scale N/b times the kept fraction)."""
    y = _data(one_site)
    keep = np.arange(N) % 2 == 0
    params = {"theta": jnp.asarray(0.3)}
    masked = mask_observations(subsampled, keep=keep, data_plate="obs")

    def one(key):
        seeded = numpyro.handlers.seed(masked, key)
        return log_density(seeded, (y,), {}, params)[0]

    values = jax.vmap(one)(random.split(random.PRNGKey(0), 4000))
    kept, _ = log_density(one_site, (y[keep],), {}, params)
    tol = 4 * np.std(values) / np.sqrt(values.size)
    assert abs(float(np.mean(values)) - float(kept)) < tol


def test_mask_errors():
    y = _data(one_site)
    with pytest.raises(ValueError, match="1-d array"):
        mask_observations(one_site, keep=np.ones((2, 3)), data_plate="obs")
    bad = mask_observations(one_site, keep=np.ones(N + 1), data_plate="obs")
    with pytest.raises(ValueError, match="has size 24"):
        log_density(bad, (y,), {}, {"theta": 0.0})


def _separate(model, y, cv, label, score):
    """Each fold fitted (its own SVI run) and scored on its own, with
    cross_validate's keys (``random.split(rng_key, 3)``: folds, fits, scores)."""
    _, fit_key, score_key = random.split(random.PRNGKey(1), 3)
    guide = AutoNormal(model)

    @jax.jit
    def fit(keep):
        masked = mask_observations(model, keep=keep, data_plate="obs")
        svi = SVI(masked, guide, optax.adam(0.05), loss=cv.candidates[label])
        state, _ = svi_scan(svi, svi.init(fit_key, y), num_steps=STEPS, args=(y,))
        return svi.get_params(state)

    out = np.zeros(y.shape[0])
    for k in range(cv.scores.sizes["fold"]):
        params = fit(jnp.asarray(cv.folds != k))
        scores = predictive_score(
            score_key, params, model, guide, y, num_draws=DRAWS, score=score
        )
        out[cv.folds == k] = scores.score[cv.folds == k]
    return out


#: A known gap: predictive_score re-estimates the log scores its first draws
#: cannot settle (far in the tail of every draw, or k̂ near good_k: more
#: draws, then moment matching); cross_validate moment-matches only k̂ ≥
#: good_k, so at those observations its held-out scores differ (by up to
#: 0.03 nats here, lower). Strict: this test says when the two agree again.
_UNSETTLED = pytest.mark.xfail(
    strict=True, reason="cross_validate does not yet re-estimate unsettled log scores"
)


@pytest.mark.slow
@pytest.mark.parametrize("batch_terms", [1 << 15, 1], ids=["batched", "one-by-one"])
@pytest.mark.parametrize(
    "model, score",
    [
        (one_site, "crps"),
        pytest.param(two_sites, "log", marks=[pytest.mark.numerics, _UNSETTLED]),
        pytest.param(local_latent, "log", marks=[pytest.mark.py312, _UNSETTLED]),
    ],
)
def test_cv_equals_separately_fitted_folds(model, score, batch_terms, monkeypatch):
    """Every candidate's pointwise held-out scores, and so its CV mean, equal
    those of folds fitted and scored one by one (a grid over λ with the
    folds, VI alone; its fits vmapped in batches, or one after another),
    with an outlier in the data."""
    monkeypatch.setattr(_programs, "BATCH_TERMS", batch_terms)
    y = _data(model, outlier=True)
    cv = _cv(model, y, score=score)
    tol = (
        dict(rtol=1e-9, atol=1e-9)
        if jax.config.jax_enable_x64
        else dict(rtol=2e-4, atol=2e-4)
    )
    for label in CANDIDATES:
        separate = _separate(model, y, cv, label, score)
        assert np.isfinite(separate).all()  # assert_allclose would pass NaN = NaN
        np.testing.assert_allclose(
            cv.scores["pointwise"].sel(candidate=label), separate, **tol
        )
        np.testing.assert_allclose(
            cv.scores["mean"].sel(candidate=label), separate.mean(), **tol
        )
    # every observation is held out exactly once, in the fold it belongs to
    np.testing.assert_array_equal(cv.scores["fold_of"], cv.folds)
    counts = np.bincount(cv.folds, minlength=4)
    np.testing.assert_allclose(
        np.asarray(cv.scores["fold_score"].sel(candidate="VI")) @ counts / N,
        cv.scores["mean"].sel(candidate="VI"),
        rtol=1e-5,
    )


@pytest.mark.slow
@pytest.mark.parametrize("score", ["log", "crps"])
def test_subsampled_plate(score):
    """A subsampled data plate is fitted on subsamples and every observation
    scored (in batches of the subsample size): with the fits held at their
    initial values (a zero learning rate), the held-out scores (and, for the
    CRPS, the stacking's pairwise gains) equal those of the same model
    without subsampling."""
    y = _data(one_site)
    held = [
        cross_validate(
            random.PRNGKey(1),
            model,
            AutoNormal(model),
            optax.sgd(0.0),
            y,
            fit=FitRecipe(num_steps=2, num_draws=DRAWS, progress_bar=False),
            candidates=CANDIDATES,
            num_folds=4,
            score=score,
        ).scores
        for model in (subsampled, one_site)
    ]
    for name in ("pointwise",) + (("pair_gain",) if score == "crps" else ()):
        np.testing.assert_allclose(held[0][name], held[1][name], rtol=1e-5, atol=2e-5)
    cv = _cv(subsampled, y)
    assert np.isfinite(cv.scores["pointwise"]).all()
    assert cv.scores.sizes["observation"] == N


@pytest.mark.slow
def test_mixture_guide():
    """A mixture guide under every candidate: finite scores, and the
    mixture's stratified predictive is what is scored."""
    y = _data(one_site)
    guide = AutoGaussianMixture(one_site, num_components=2)
    cv = cross_validate(
        random.PRNGKey(1),
        one_site,
        guide,
        optax.adam(0.05),
        y,
        fit=FitRecipe(num_steps=STEPS, num_draws=DRAWS, progress_bar=False),
        candidates=default_candidates(guide, num_particles=4),
        num_folds=3,
    )
    assert np.isfinite(cv.scores["pointwise"]).all()
    # VI of a mixture is the stratified ELBO (Trace_ELBO cannot learn weights)
    assert isinstance(cv.candidates["VI"], StratifiedELBO)
    assert cv.reference == "VI"


def _toy(sigma, n, seed):
    """Lai & Yao's toy: the model says y ~ N(theta, 1); the data have sd sigma."""
    y = sigma * np.random.default_rng(seed).standard_normal(n)
    return jnp.asarray(y, jnp.result_type(float))


def _held_out(loss, y, y_test):
    guide = AutoNormal(one_site)
    svi = SVI(one_site, guide, optax.adam(0.05), loss=loss)
    result = svi.run(random.PRNGKey(5), 600, y, progress_bar=False)
    s = predictive_score(random.PRNGKey(6), result.params, one_site, guide, y_test)
    return np.asarray(s)


@pytest.mark.slow
@pytest.mark.parametrize("sigma", [1.0, 2.0])
def test_selection_known_answers(sigma):
    """Well specified (sigma = 1): the choice is not significantly worse than
    VI on fresh data. Misspecified (sigma = 2, Lai & Yao's toy): a small λ is
    chosen (pure prediction, or a regularizer that does not pull it toward VI)
    and beats VI on fresh data by far more than its standard error."""
    y, y_test = _toy(sigma, 60, 0), _toy(sigma, 2000, 1)
    cv = cross_validate(
        random.PRNGKey(0),
        one_site,
        AutoNormal(one_site),
        optax.adam(0.05),
        y,
        fit=FitRecipe(num_steps=600, num_draws=256, progress_bar=False),
        candidates=default_candidates(AutoNormal(one_site), num_particles=16),
    )
    vi = _held_out(Trace_ELBO(num_particles=16), y, y_test)
    chosen = _held_out(cv.best, y, y_test)
    diff = chosen - vi
    se = diff.std(ddof=1) / np.sqrt(diff.size)
    if sigma == 1.0:
        assert diff.mean() > -2 * se - 1e-6, (cv.best_label, diff.mean(), se)
    else:
        # a predictive candidate far from the VI limit
        assert cv.best_label not in {"VI", "posterior lam=1", "posterior lam=10"}
        assert diff.mean() > 5 * se and diff.mean() > 0.2, (diff.mean(), se)


def two_plates(y):
    """Observations in one plate and, in another, a second observed site that
    is a function of a latent (as NumPyro's CUPED notebook writes it): no
    one plate holds every observed site."""
    theta = numpyro.sample("theta", dist.Normal(0.0, 3.0))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)
    with numpyro.plate("other", y.shape[0]):
        numpyro.sample("z", dist.Normal(0.0, 2.0), obs=y - theta)


def test_candidates_score_the_plate_the_folds_hold_out():
    """The default candidates take the cross-validation's data plate; a
    candidate that indexes observations otherwise is refused, naming it and
    the data_plate that works."""
    y = random.normal(random.PRNGKey(0), (N,))
    guide = AutoNormal(two_plates)
    fit = FitRecipe(num_steps=5, num_draws=20, progress_bar=False)

    def cv(candidates):
        return cross_validate(
            random.PRNGKey(1),
            two_plates,
            guide,
            optax.adam(0.01),
            y,
            fit=fit,
            candidates=candidates,
            num_folds=2,
            data_plate="obs",
        )

    assert cv(None).scores.sizes["candidate"] == 8
    for own, match in ((None, "finds no data plate"), ("other", "by 'other'")):
        wrong = PredictiveELBO(num_particles=2, lam=0, data_plate=own)
        with pytest.raises(ValueError, match=f"'lam=0'.*{match}.*data_plate='obs'"):
            cv([Trace_ELBO(), wrong])
    right = PredictiveELBO(num_particles=2, lam=0, data_plate="obs")
    assert np.all(np.isfinite(cv([Trace_ELBO(), right]).scores["mean"]))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(num_folds=1), ValueError, "at least 2 folds"),
        (dict(num_folds=N + 1), ValueError, "larger than the 24 observations"),
        (dict(candidates=[]), ValueError, "candidates is empty"),
        (dict(candidates={"a": "elbo"}), TypeError, "not a NumPyro objective"),
        (dict(score="quadratic"), ValueError, "no finite support"),
        (
            dict(candidates={"p": PredictiveELBO(num_particles=4)}),
            ValueError,
            "no candidate is plain VI",
        ),
        (dict(rule="median"), ValueError, "rule must be one of"),
        (dict(num_steps=0), ValueError, "num_steps"),
    ],
)
def test_bad_input(kwargs, error, match):
    y = _data(one_site)
    steps = kwargs.pop("num_steps", STEPS)
    with pytest.raises(error, match=match):
        cross_validate(
            random.PRNGKey(1),
            one_site,
            AutoNormal(one_site),
            optax.adam(0.05),
            y,
            fit=FitRecipe(num_steps=steps, progress_bar=False),
            **kwargs,
        )


class _Broken(Trace_ELBO):
    """A loss that fails when its program is traced."""

    def loss_with_mutable_state(self, *args, **kwargs):
        raise ValueError("broken loss")


@pytest.mark.parametrize("cause", ["error", "interrupt"])
def test_an_error_stops_the_fits_already_running(cause, monkeypatch):
    """The first grid's fits start as soon as it is lowered; an error in a
    later grid's lowering, or an interrupt (Ctrl-C) while they run, is
    raised and stops them after their current block, instead of letting
    them run to the end (10⁶ steps here)."""
    results, finished = [], threading.Event()

    def recorded(*args, **kwargs):
        if cause == "interrupt":
            # Ctrl-C: SIGINT to the caller once it waits for the fits (a
            # wait that only a real signal interrupts), KeyboardInterrupt
            time.sleep(0.5)
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        results.append(fit_grid(*args, **kwargs))
        finished.set()
        return results[-1]

    fit_grid = _programs.fit_grid
    monkeypatch.setattr(_held_out_scores, "fit_grid", recorded)
    candidates = {"VI": Trace_ELBO()}
    if cause == "error":
        candidates["broken"] = _Broken()
    y = _data(one_site)
    raised = (
        (ValueError, "broken loss") if cause == "error" else (KeyboardInterrupt, None)
    )
    with pytest.raises(raised[0], match=raised[1]):
        cross_validate(
            random.PRNGKey(1),
            one_site,
            AutoNormal(one_site),
            optax.adam(0.05),
            y,
            fit=FitRecipe(num_steps=10**6, progress_bar=False),
            candidates=candidates,
        )
    finished.wait()
    assert results == [None]  # the VI grid ran, and stopped unfinished


@pytest.mark.slow
def test_no_plate_equals_the_plate_version():
    """The model without a plate (``obs=y`` on a vector) is cross-validated
    over its elements, with the plate version's held-out scores."""

    def model(y):
        theta = numpyro.sample("theta", dist.Normal(0.0, 3.0))
        numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)

    y = _data(one_site)
    cvs = [_cv(m, y) for m in (model, one_site)]
    np.testing.assert_allclose(
        cvs[0].scores["pointwise"].values, cvs[1].scores["pointwise"].values, rtol=1e-5
    )


@pytest.mark.slow
@pytest.mark.py312
def test_summaries_of_scores_whose_squares_overflow_float32():
    """A fit that diverged scores its observations around -1e20 (a Poisson
    rate of e^45): the summaries are taken in float64, without an overflow
    (float32's largest square root is 1.8e19)."""
    from numpyro_pvi.evaluation.held_out import Pointwise
    from numpyro_pvi.selection._held_out_scores import scores_dataset

    candidates = default_candidates(AutoNormal(one_site), num_particles=4)
    labels, n = list(candidates), 12
    rng = np.random.default_rng(0)
    held_out = {
        c: (
            Pointwise(
                (-1e20 * (1.0 + rng.random(n))).astype(np.float32),
                np.full(n, 1e19, np.float32),
                np.full(n, np.nan, np.float32),
                np.ones(n, bool),
            ),
            np.zeros(n, bool),
        )
        for c in labels
    }
    folds = np.arange(n) % 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = scores_dataset(
            candidates, held_out, {c: np.zeros(3) for c in labels}, folds, labels[0]
        )
    scores = np.stack([held_out[c][0].score for c in labels]).astype(float)
    np.testing.assert_allclose(
        ds["se"].values, scores.std(1, ddof=1) / np.sqrt(n), rtol=1e-12
    )
    diff = scores - scores[0]
    np.testing.assert_allclose(
        ds["diff_se"].values, diff.std(1, ddof=1) / np.sqrt(n), rtol=1e-12
    )
    assert ds["pointwise"].dtype == np.float64


def test_result_reading_and_plot():
    import matplotlib.pyplot as plt

    y = _toy(2.0, 40, 0)
    cv = cross_validate(
        random.PRNGKey(0),
        one_site,
        AutoNormal(one_site),
        optax.adam(0.05),
        y,
        fit=FitRecipe(num_steps=100, num_draws=DRAWS, progress_bar=False),
        candidates=default_candidates(AutoNormal(one_site), num_particles=4),
    )
    assert isinstance(cv, CrossValidation)
    assert (
        list(cv.scores.candidate.values)[0] == "VI"
        and cv.scores.sizes["candidate"] == 8
    )
    assert cv.best is cv.candidates[cv.best_label]
    assert cv.select("best") == str(
        cv.scores.candidate[int(np.nanargmax(cv.scores["mean"]))].values
    )
    assert cv.best_label in str(cv) and "selected" in str(cv)
    axes = plot_cross_validation(cv)
    assert len(axes) == 2
    # one error-bar curve per regularizer and the VI line in the first panel
    assert {t.get_text() for t in axes[0].get_legend().get_texts()} >= {
        "PVI, prior regularizer",
        "PVI, posterior regularizer",
        "VI",
        "selected",
    }
    plt.close("all")
    with pytest.raises(TypeError, match="result of cross_validate"):
        plot_cross_validation(cv.scores)


def test_sequence_labels_name_the_score_where_candidates_differ_in_it():
    from numpyro_pvi.selection._candidates import labelled

    one_score = [Trace_ELBO(), PredictiveELBO(lam=0.1), PredictiveELBO(lam=0.1)]
    assert list(labelled(one_score)) == ["VI", "prior lam=0.1", "prior lam=0.1 #2"]
    two_scores = iter([Trace_ELBO(), PredictiveELBO(lam=0.1), PredictiveELBO("crps")])
    assert list(labelled(two_scores)) == ["VI", "log prior lam=0.1", "crps prior lam=1"]


def _counts(y, n):
    """A Binomial whose total counts are an argument (NumPyro's baseball
    example): the quadratic score enumerates their support, so it needs
    their values when the programs are traced."""
    theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Binomial(n, logits=theta), obs=y)


def test_a_score_that_needs_the_arguments_values_gets_them_as_constants():
    """With the counts as an argument, the programs are made again with the
    arguments as constants (as ``SVI.run`` closes over them): the scores
    equal those of the model that closes over the counts itself."""
    n = jnp.asarray(np.arange(N) % 5 + 1, jnp.int32)
    y = jnp.asarray(np.arange(N) % 2 * n // 2, jnp.result_type(float))
    scores = [
        cross_validate(
            random.PRNGKey(1),
            model,
            AutoNormal(model),
            optax.adam(0.05),
            *args,
            fit=FitRecipe(num_steps=STEPS, num_draws=DRAWS, progress_bar=False),
            candidates=[Trace_ELBO(), PredictiveELBO("quadratic", num_particles=4)],
            num_folds=3,
            score="quadratic",
        ).scores
        for model, args in [(_counts, (y, n)), (lambda y: _counts(y, n), (y,))]
    ]
    # (the gains are differences of scores of order 1: to their rounding)
    for name in ("pointwise", "pair_gain"):
        np.testing.assert_allclose(
            scores[0][name], scores[1][name], rtol=1e-5, atol=2e-6
        )
    assert np.isfinite(scores[0]["pointwise"]).all()


class _Uncopyable(AutoNormal):
    """An autoguide ``copy.deepcopy`` refuses (it holds, say, a lock)."""

    def __deepcopy__(self, memo):
        raise TypeError("this guide cannot be copied")


class _EagerOnly(AutoNormal):
    """An autoguide whose prototype reads a value in Python: it can only be
    built outside a trace."""

    def _setup_prototype(self, *args, **kwargs):
        super()._setup_prototype(*args, **kwargs)
        self.first_value = float(self._init_locs["theta"])


def _scores_with(guide, y):
    scores = cross_validate(
        random.PRNGKey(1),
        one_site,
        guide,
        optax.adam(0.05),
        y,
        fit=FitRecipe(num_steps=STEPS, num_draws=DRAWS, progress_bar=False),
        candidates=CANDIDATES,
        num_folds=4,
    ).scores
    return scores["pointwise"]


@pytest.mark.numerics
def test_the_programs_build_the_guides_prototype(monkeypatch):
    """An autoguide that has not run yet builds its prototype in the
    programs' traces (nothing runs eagerly; the user's guide is left as it
    was), with the same scores as when it was built eagerly from the same key
    before (as ``SVI.init`` builds it); a guide that cannot be copied, or
    whose prototype cannot be built under a trace, is built eagerly instead,
    to the same scores. The outlier's scores are moment-matched, in
    programs that build the prototype the same way."""
    matched, build = [], _held_out_scores.moment_matcher

    def matcher(*args, **kwargs):
        matched.append(args[3].prototype_trace is None)  # the guide, as given
        return build(*args, **kwargs)

    y = _data(one_site, outlier=True)
    fresh = AutoNormal(one_site)
    with monkeypatch.context() as m:
        m.setattr(_held_out_scores, "moment_matcher", matcher)
        traced = _scores_with(fresh, y)
    assert matched and all(matched)  # the outlier's draws, moved
    assert fresh.prototype_trace is None
    built = AutoNormal(one_site)
    _, fit_key, _ = random.split(random.PRNGKey(1), 3)
    SVI(one_site, built, optax.adam(0.05), loss=Trace_ELBO()).init(fit_key, y)
    tol = dict(rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(traced, _scores_with(built, y), **tol)
    assert np.isfinite(traced).all()
    for guide in (_Uncopyable(one_site), _EagerOnly(one_site)):
        np.testing.assert_allclose(traced, _scores_with(guide, y), **tol)
        assert guide.prototype_trace is not None  # built eagerly


def _no_valid_start(y):
    """Every initial value of ``theta`` (uniform on (-2, 2)) has zero density."""
    theta = numpyro.sample("theta", dist.Normal(0.0, 3.0))
    numpyro.factor("far", jnp.where(theta > 100.0, 0.0, -jnp.inf))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)


def test_invalid_initial_values_raise_numpyros_error():
    """The search for valid initial values runs in the programs, where it
    cannot raise; fits that start from invalid values (their losses
    infinite, their gradients finite) end in NumPyro's own error, as
    ``SVI.run`` raises it, not in scores that ignore the factor."""
    with pytest.raises(RuntimeError, match="Cannot find valid initial parameters"):
        _cv(_no_valid_start, _data(one_site))
