"""Discrete sites marked for enumeration (``infer={"enumerate": "parallel"}``,
``config_enumerate``), as NumPyro users write mixtures and HMMs for
``TraceEnum_ELBO``: every objective and diagnostic sums them out within each
observation of the data plate. Known answers: the mixture written with
``MixtureSameFamily``, and an HMM's forward algorithm written by hand."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from jax import random
from numpyro.contrib.control_flow import scan
from numpyro.contrib.funsor import markov
from numpyro.handlers import block, seed, trace
from numpyro.infer import SVI, TraceEnum_ELBO
from numpyro.infer.autoguide import AutoNormal
from numpyro.ops.indexing import Vindex

from numpyro_pvi import (
    FitRecipe,
    PACmELBO,
    PredictiveELBO,
    Replications,
    SNISForwardKL,
    SoftCVIELBO,
    diagnostics,
    predictive_score,
)
from numpyro_pvi._trace.enumeration import marginalized
from numpyro_pvi.guides import AutoFlow, AutoGaussianMixture
from numpyro_pvi.selection import cross_validate, stack
from tests.programs import toy_mixture

pytestmark = pytest.mark.py312

K = 2
DATA = jnp.array([0.0, 1.0, 10.0, 11.0, 12.0, 30.0] * 3)


def enumerated(data, chosen_loc=False, observed=True):
    weights = numpyro.sample("weights", dist.Dirichlet(0.5 * jnp.ones(K)))
    scale = numpyro.sample("scale", dist.LogNormal(0.0, 2.0))
    with numpyro.plate("components", K):
        locs = numpyro.sample("locs", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", len(data)):
        assignment = numpyro.sample(
            "assignment", dist.Categorical(weights), infer={"enumerate": "parallel"}
        )
        if chosen_loc:  # a deterministic site of the enumerated value
            numpyro.deterministic("chosen_loc", locs[assignment])
        with numpyro.handlers.mask(mask=observed):
            numpyro.sample("obs", dist.Normal(locs[assignment], scale), obs=data)


def summed_out(data, observed=True):
    weights = numpyro.sample("weights", dist.Dirichlet(0.5 * jnp.ones(K)))
    scale = numpyro.sample("scale", dist.LogNormal(0.0, 2.0))
    with numpyro.plate("components", K):
        locs = numpyro.sample("locs", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", len(data)):
        mixture = dist.MixtureSameFamily(
            dist.Categorical(weights), dist.Normal(locs, scale)
        )
        numpyro.sample("obs", mixture.mask(observed), obs=data)


def mixture_params(scale=0.3):
    """``AutoNormal`` parameters over the global sites (the same sites for
    both models' guides); the outlier at 30 is far from both components."""
    return {
        "weights_auto_loc": jnp.array([0.3]),
        "weights_auto_scale": jnp.array([scale]),
        "scale_auto_loc": jnp.array(0.2),
        "scale_auto_scale": jnp.array(scale),
        "locs_auto_loc": jnp.array([0.5, 11.0]),
        "locs_auto_scale": jnp.full(K, scale),
    }


def guides():
    return AutoNormal(block(enumerated, hide=["assignment"])), AutoNormal(summed_out)


OBJECTIVES = {
    "PredictiveELBO-log": lambda: PredictiveELBO("log", num_particles=3),
    "PredictiveELBO-log-prior": lambda: PredictiveELBO(
        "log", num_particles=3, regularizer="prior", lam=0.5
    ),
    # one enumerated site selecting one observation: the mixture, CRPS in
    # closed form (the energy score with beta = 1 is the CRPS)
    "PredictiveELBO-crps": lambda: PredictiveELBO("crps", num_particles=3),
    "PredictiveELBO-energy": lambda: PredictiveELBO("energy", num_particles=3),
    "PACmELBO": lambda: PACmELBO(num_particles=3),
    "SoftCVIELBO": lambda: SoftCVIELBO(num_particles=3),
    "SNISForwardKL": lambda: SNISForwardKL(num_particles=3),
}


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_every_objective_equals_the_mixture_written_in_the_model(name):
    """Loss and gradient at the same parameters and key."""
    loss, params = OBJECTIVES[name](), mixture_params()
    guide_enum, guide_sum = guides()
    SVI(enumerated, guide_enum, optax.adam(0.01), loss).init(random.PRNGKey(0), DATA)
    SVI(summed_out, guide_sum, optax.adam(0.01), loss).init(random.PRNGKey(0), DATA)

    def value(p, model, guide):
        return loss.loss(random.PRNGKey(1), p, model, guide, DATA)

    a, ga = jax.value_and_grad(value)(params, enumerated, guide_enum)
    b, gb = jax.value_and_grad(value)(params, summed_out, guide_sum)
    np.testing.assert_allclose(a, b, rtol=1e-5)
    for k in params:
        np.testing.assert_allclose(ga[k], gb[k], rtol=1e-4, atol=1e-4)


def test_a_pvi_fit_equals_the_mixture_s_and_differs_from_one_assignment():
    guide_enum, guide_sum = guides()
    runs = [
        SVI(m, g, optax.adam(0.05), PredictiveELBO(num_particles=4)).run(
            random.PRNGKey(2), 50, DATA, progress_bar=False
        )
        for m, g in [(enumerated, guide_enum), (summed_out, guide_sum)]
    ]
    np.testing.assert_allclose(runs[0].losses, runs[1].losses, rtol=1e-4)


@pytest.mark.parametrize(
    "make_guide",
    [
        lambda model: AutoGaussianMixture(model, num_components=2),
        lambda model: AutoFlow(model),
    ],
    ids=["gaussian-mixture", "flow"],
)
def test_mixture_and_flow_guides_with_one_particle_fit_as_the_mixture_s(make_guide):
    """M = 1; a flow's fit diverges chaotically from rounding after some
    steps, so three are compared."""
    runs = [
        SVI(m, make_guide(g), optax.adam(0.02), PredictiveELBO(num_particles=1)).run(
            random.PRNGKey(0), 3, DATA, progress_bar=False
        )
        for m, g in [
            (enumerated, block(enumerated, hide=["assignment"])),
            (summed_out, summed_out),
        ]
    ]
    np.testing.assert_allclose(runs[0].losses, runs[1].losses, rtol=1e-5)


def test_predictive_score_and_psis_equal_the_mixture_s():
    key, params = random.PRNGKey(3), mixture_params()
    guide_enum, guide_sum = guides()
    a = predictive_score(key, params, enumerated, guide_enum, DATA, num_draws=200)
    b = predictive_score(key, params, summed_out, guide_sum, DATA, num_draws=200)
    np.testing.assert_allclose(a.score, b.score, rtol=1e-5)
    assert float(a.score[-1]) < -20  # the outlier: summed, not one assignment
    ka = diagnostics.psis(key, params, enumerated, guide_enum, DATA, num_draws=200)
    kb = diagnostics.psis(key, params, summed_out, guide_sum, DATA, num_draws=200)
    np.testing.assert_allclose(
        diagnostics.get_group(ka, "psis")["pareto_k"].values,
        diagnostics.get_group(kb, "psis")["pareto_k"].values,
        rtol=1e-4,
    )


def test_masked_observations_score_zero_and_leave_the_others_alone():
    key, params = random.PRNGKey(7), mixture_params()
    guide_enum, guide_sum = guides()
    observed = jnp.arange(len(DATA)) % 4 != 1
    loss = PredictiveELBO(num_particles=3)
    np.testing.assert_allclose(
        loss.loss(key, params, enumerated, guide_enum, DATA, observed=observed),
        loss.loss(key, params, summed_out, guide_sum, DATA, observed=observed),
        rtol=1e-5,
    )
    for score in ("log", "crps"):
        a, b = (
            predictive_score(
                key, params, m, g, DATA, observed=observed, score=score, num_draws=500
            )
            for m, g in [(enumerated, guide_enum), (summed_out, guide_sum)]
        )
        assert np.all(np.asarray(a.score)[~observed] == 0), score
        gap = np.abs(np.asarray(a.score - b.score))
        assert np.all(gap < 5 * np.hypot(a.se, b.se) + 1e-4), (score, gap)


def test_the_crps_simulates_the_assignments_within_monte_carlo_error():
    """The held-out CRPS from ancestral draws equals the mixture's closed
    form to a few of its reported standard errors."""
    key, params = random.PRNGKey(4), mixture_params(scale=1e-3)
    guide_enum, guide_sum = guides()
    a = predictive_score(
        key, params, enumerated, guide_enum, DATA, score="crps", num_draws=2000
    )
    b = predictive_score(
        key, params, summed_out, guide_sum, DATA, score="crps", num_draws=2000
    )
    gap = np.abs(np.asarray(a.score - b.score))
    se = np.hypot(np.asarray(a.se), np.asarray(b.se))
    assert np.all(gap < 5 * se + 1e-3), (gap, se)


def test_diagnostics_export_and_report_the_summed_out_likelihood():
    key, params = random.PRNGKey(5), mixture_params()
    guide_enum, guide_sum = guides()
    exported = diagnostics.to_inference_data(
        key, params, enumerated, guide_enum, DATA, num_draws=50
    )
    reference = diagnostics.to_inference_data(
        key, params, summed_out, guide_sum, DATA, num_draws=50
    )
    np.testing.assert_allclose(
        diagnostics.get_group(exported, "log_likelihood")["obs"].values,
        diagnostics.get_group(reference, "log_likelihood")["obs"].values,
        rtol=1e-5,
    )
    diagnostics.report(
        key,
        params,
        enumerated,
        guide_enum,
        DATA,
        loss=TraceEnum_ELBO(),
        num_draws=50,
        show=False,
    )
    diagnostics.psis_resample(key, params, enumerated, guide_enum, DATA, num_draws=50)


def test_the_export_draws_the_assignments_from_their_posterior():
    """``infer_discrete``'s draws: each observation's assignment is drawn at
    its posterior probability given the draw of the continuous sites (the
    frequency within Monte Carlo error of the mean probability), and a
    deterministic site of it takes the drawn value."""

    def with_chosen_loc(data):
        enumerated(data, chosen_loc=True)

    guide = AutoNormal(block(with_chosen_loc, hide=["assignment"]))
    num_draws = 400
    exported = diagnostics.to_inference_data(
        random.PRNGKey(0),
        mixture_params(scale=0.5),
        with_chosen_loc,
        guide,
        DATA,
        num_draws=num_draws,
    )
    post = diagnostics.get_group(exported, "posterior")
    z = post["assignment"].values[0]  # (S, N)
    locs, scale = post["locs"].values[0], post["scale"].values[0]
    weights = post["weights"].values[0]
    np.testing.assert_array_equal(
        post["chosen_loc"].values[0], np.take_along_axis(locs, z, axis=1)
    )
    log_joint = np.log(weights)[:, None, :] + dist.Normal(
        locs[:, None, :], scale[:, None, None]
    ).log_prob(np.asarray(DATA)[None, :, None])
    prob = np.exp(log_joint[..., 1] - np.logaddexp(*np.moveaxis(log_joint, -1, 0)))
    frequency, expected = z.mean(0), prob.mean(0)
    se = np.sqrt(np.maximum(expected * (1 - expected), 1e-4) / num_draws)
    np.testing.assert_array_less(np.abs(frequency - expected), 4 * se + 1e-6)
    assert expected.min() < 0.05 and expected.max() > 0.95  # both components


def test_a_global_enumerated_site_is_refused_naming_it():
    def model(data):
        z = numpyro.sample(
            "regime", dist.Bernoulli(0.5), infer={"enumerate": "parallel"}
        )
        loc = numpyro.sample("loc", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", len(data)):
            numpyro.sample("obs", dist.Normal(loc + 3 * z, 1.0), obs=data)

    guide = AutoNormal(block(model, hide=["regime"]))
    params = {"loc_auto_loc": jnp.array(0.0), "loc_auto_scale": jnp.array(1.0)}
    with pytest.raises(ValueError, match="enumerated site 'regime' is outside every"):
        predictive_score(random.PRNGKey(0), params, model, guide, DATA)


def local_latent(data):
    """``annotation.py``'s item-difficulty shape: a latent of the data plate
    whose law depends on the enumerated class, the observation on both."""
    shift = numpyro.sample("shift", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", len(data)):
        c = numpyro.sample("c", dist.Bernoulli(0.3), infer={"enumerate": "parallel"})
        theta = numpyro.sample("theta", dist.Normal(3.0 * c, 1.0))
        numpyro.sample("obs", dist.Normal(theta + shift * c, 1.0), obs=data)


def local_latent_by_hand(data):
    """The same joint density: ``theta``'s the two-component mixture, the
    observation's the mixture over ``c`` weighted by p(c | theta)."""
    shift = numpyro.sample("shift", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", len(data)):
        mixing = dist.Categorical(jnp.array([0.7, 0.3]))
        theta = numpyro.sample(
            "theta",
            dist.MixtureSameFamily(mixing, dist.Normal(jnp.array([0.0, 3.0]), 1.0)),
        )
        joint = jnp.log(jnp.array([0.7, 0.3])) + dist.Normal(
            jnp.array([0.0, 3.0]), 1.0
        ).log_prob(theta[:, None])
        posterior = jax.nn.log_softmax(joint, axis=-1)  # log p(c | theta)
        log_lik = dist.Normal(theta[:, None] + shift * jnp.arange(2), 1.0).log_prob(
            data[:, None]
        )
        numpyro.factor("obs", jax.nn.logsumexp(posterior + log_lik, -1))


def test_a_latent_of_the_data_plate_after_an_enumerated_site_is_summed_with_it():
    """Its density is the mixture over the enumerated site; each observation's
    law given it weighs the enumerated values by their posterior given it."""
    params = {
        "shift_auto_loc": jnp.array(1.5),
        "shift_auto_scale": jnp.array(0.2),
        "theta_auto_loc": DATA / 2,
        "theta_auto_scale": jnp.full_like(DATA, 0.5),
    }
    key = random.PRNGKey(8)
    guide = AutoNormal(block(local_latent, hide=["c"]))
    reference = AutoNormal(local_latent_by_hand)
    options = {"num_draws": 100, "max_draws": 100, "moment_match": False}
    a = predictive_score(key, params, local_latent, guide, DATA, **options)
    b = predictive_score(key, params, local_latent_by_hand, reference, DATA, **options)
    np.testing.assert_allclose(a.score, b.score, rtol=1e-5)
    for loss in (PredictiveELBO(num_particles=3), SoftCVIELBO(num_particles=3)):
        np.testing.assert_allclose(
            loss.loss(key, params, local_latent, guide, DATA),
            loss.loss(key, params, local_latent_by_hand, reference, DATA),
            rtol=1e-5,
        )
    with pytest.raises(ValueError, match=r"'obs'.*cannot be simulated.*theta"):
        predictive_score(key, params, local_latent, guide, DATA, score="crps")


def test_a_site_the_guide_draws_is_the_guide_s():
    """Marked for enumeration but drawn by the guide (a Categorical guide
    site): an ordinary latent, fitted by the objectives that take discrete
    guides."""

    def guide(data):
        logits = numpyro.param("logits", jnp.zeros((len(data), K)))
        numpyro.sample("weights", dist.Dirichlet(jnp.ones(K)))
        numpyro.sample("scale", dist.LogNormal(0.0, 1.0))
        with numpyro.plate("components", K):
            numpyro.sample("locs", dist.Normal(jnp.array([0.5, 11.0]), 1.0))
        with numpyro.plate("data", len(data)):
            numpyro.sample("assignment", dist.Categorical(logits=logits))

    svi = SVI(enumerated, guide, optax.adam(0.05), SoftCVIELBO(num_particles=4))
    result = svi.run(random.PRNGKey(0), 20, DATA, progress_bar=False)
    assert np.isfinite(result.losses).all()
    # the folds of cross-validation keep it the guide's: summed out of the
    # model, NumPyro would warn of a guide site the model does not have
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cv = cross_validate(
            random.PRNGKey(1),
            enumerated,
            guide,
            optax.adam(0.05),
            DATA,
            candidates={"softcvi": SoftCVIELBO(num_particles=4)},
            fit=FitRecipe(num_steps=10, num_draws=20, progress_bar=False),
            num_folds=2,
            rule="best",
        )
    assert not [w for w in caught if "guide but not model" in str(w.message)]
    assert np.all(np.isfinite(cv.scores["pointwise"].values))


# --------------------------------------------------------------------------
# HMMs over a plate of sequences
# --------------------------------------------------------------------------

S, T, H = 4, 5, 2
SEQUENCES = 2.0 * random.normal(random.PRNGKey(0), (S, T))


def _globals():
    trans = numpyro.sample("trans", dist.Dirichlet(jnp.ones(H)).expand([H]).to_event(1))
    locs = numpyro.sample("locs", dist.Normal(0.0, 3.0).expand([H]).to_event(1))
    return trans, locs


def hmm_markov(ys):
    trans, locs = _globals()
    with numpyro.plate("sequences", S):
        x = 0
        for t in markov(range(T)):
            x = numpyro.sample(
                f"x_{t}", dist.Categorical(trans[x]), infer={"enumerate": "parallel"}
            )
            numpyro.sample(f"y_{t}", dist.Normal(locs[x], 1.0), obs=ys[:, t])


def hmm_scan(ys):
    trans, locs = _globals()

    def transition(x, y):
        with numpyro.plate("sequences", S):
            x = numpyro.sample(
                "x", dist.Categorical(trans[x]), infer={"enumerate": "parallel"}
            )
            numpyro.sample("y", dist.Normal(locs[x], 1.0), obs=y)
        return x, None

    scan(transition, jnp.zeros(S, int), ys.T)


def forward(ys, trans, locs):
    """Per sequence, log p(y) by the forward algorithm (state 0 before t=0)."""

    def one(y):
        def step(alpha, y_t):
            alpha = jax.nn.logsumexp(alpha[:, None] + jnp.log(trans), 0)
            return alpha + dist.Normal(locs, 1.0).log_prob(y_t), None

        alpha0 = jnp.log(trans[0]) + dist.Normal(locs, 1.0).log_prob(y[0])
        return jax.nn.logsumexp(jax.lax.scan(step, alpha0, y[1:])[0])

    return jax.vmap(one)(ys)


def hmm_by_hand(ys):
    trans, locs = _globals()
    with numpyro.plate("sequences", S):
        numpyro.factor("forward", forward(ys, trans, locs))


HMM_PARAMS = {
    "trans_auto_loc": jnp.array([[1.0], [-0.5]]),
    "trans_auto_scale": jnp.full((H, 1), 0.2),
    "locs_auto_loc": jnp.array([-1.5, 1.5]),
    "locs_auto_scale": jnp.full(H, 0.2),
}


@pytest.mark.parametrize("model", [hmm_markov, hmm_scan], ids=["markov", "scan"])
def test_an_hmm_equals_the_forward_algorithm_per_sequence(model):
    guide = AutoNormal(block(model, expose=["trans", "locs"]))
    reference = AutoNormal(hmm_by_hand)
    key = random.PRNGKey(6)
    # the same draws (a factor's outcome cannot be simulated, so the reference
    # would settle its scores differently)
    options = {"num_draws": 100, "max_draws": 100, "moment_match": False}
    a = predictive_score(key, HMM_PARAMS, model, guide, SEQUENCES, **options)
    b = predictive_score(key, HMM_PARAMS, hmm_by_hand, reference, SEQUENCES, **options)
    assert a.score.shape == (S,)
    np.testing.assert_allclose(a.score, b.score, rtol=1e-5)
    loss = PredictiveELBO(num_particles=3)
    la = loss.loss(key, HMM_PARAMS, model, guide, SEQUENCES)
    lb = loss.loss(key, HMM_PARAMS, hmm_by_hand, reference, SEQUENCES)
    np.testing.assert_allclose(la, lb, rtol=1e-5)


@pytest.mark.parametrize("model", [hmm_markov, hmm_scan], ids=["markov", "scan"])
def test_the_energy_objective_of_an_hmm_refuses_naming_the_sites(model):
    """A chain's observations are no mixture over one enumerated site: their
    draws have no gradient, and the refusal says what works."""
    guide = AutoNormal(block(model, expose=["trans", "locs"]))
    loss = PredictiveELBO("energy", num_particles=2)
    with pytest.raises(ValueError, match=r"enumerated site\(s\) \['x.*Use score='log'"):
        loss.loss(random.PRNGKey(0), HMM_PARAMS, model, guide, SEQUENCES)


@pytest.mark.parametrize("model", [hmm_markov, hmm_scan], ids=["markov", "scan"])
def test_the_summed_out_law_scores_other_sequences_than_the_data(model):
    """The law's density at values that are not the model's data (held-out
    and simulated observations), scan's first steps included."""
    fixed = {
        "trans": jnp.array([[0.8, 0.2], [0.3, 0.7]]),
        "locs": jnp.array([-1.0, 1.0]),
    }
    tr = trace(seed(numpyro.handlers.substitute(marginalized(model), fixed), 0))
    site = next(
        s
        for s in tr.get_trace(SEQUENCES).values()
        if s["type"] == "sample" and s["is_observed"]
    )
    other = SEQUENCES[::-1] + 0.5
    np.testing.assert_allclose(
        site["fn"].log_prob(jnp.reshape(other, site["value"].shape)),
        forward(other, fixed["trans"], fixed["locs"]),
        rtol=1e-5,
    )
    draws = site["fn"].sample(random.PRNGKey(1), (3,))
    assert draws.shape == (3,) + site["value"].shape


LENGTHS = jnp.array([5, 3, 1, 4])


def hmm_of_lengths(ys):
    """``hmm_enum.py``'s padding: a mask on the steps past each length."""
    trans, locs = _globals()

    def transition(carry, y):
        x, t = carry
        with numpyro.plate("sequences", S), numpyro.handlers.mask(mask=t < LENGTHS):
            x = numpyro.sample(
                "x", dist.Categorical(trans[x]), infer={"enumerate": "parallel"}
            )
            numpyro.sample("y", dist.Normal(locs[x], 1.0), obs=y)
        return (x, t + 1), None

    scan(transition, (jnp.zeros(S, int), 0), ys.T)


def forward_of_lengths(ys, trans, locs):
    """The forward algorithm of each sequence up to its length."""
    return jnp.stack(
        [
            forward(y[None, :n], trans, locs)[0]
            for y, n in zip(ys, LENGTHS.tolist(), strict=True)
        ]
    )


def lengths_by_hand(ys):
    trans, locs = _globals()
    with numpyro.plate("sequences", S):
        numpyro.factor("forward", forward_of_lengths(ys, trans, locs))


def second_order_hmm(ys):
    """``hmm_enum.py``'s second-order HMM: ``scan(..., history=2)``."""
    trans = numpyro.sample(
        "trans", dist.Dirichlet(jnp.ones(H)).expand([H, H]).to_event(2)
    )
    locs = numpyro.sample("locs", dist.Normal(0.0, 3.0).expand([H]).to_event(1))

    def transition(carry, y):
        x_prev, x_curr = carry
        with numpyro.plate("sequences", S):
            x = numpyro.sample(
                "x",
                dist.Categorical(Vindex(trans)[x_prev, x_curr]),
                infer={"enumerate": "parallel"},
            )
            numpyro.sample("y", dist.Normal(locs[x], 1.0), obs=y)
        return (x_curr, x), None

    scan(transition, (jnp.zeros(S, int), jnp.zeros(S, int)), ys.T, history=2)


def second_order_forward(ys, trans, locs):
    """Forward over the pairs (previous, current) state; both 0 before t=0."""

    def one(y):
        def step(alpha, y_t):  # alpha[p, c] -> alpha[c, n]
            moved = jax.nn.logsumexp(alpha[:, :, None] + jnp.log(trans), 0)
            return moved + dist.Normal(locs, 1.0).log_prob(y_t), None

        first = jnp.log(trans[0, 0]) + dist.Normal(locs, 1.0).log_prob(y[0])
        alpha0 = jnp.full((H, H), -jnp.inf).at[0].set(first)
        return jax.nn.logsumexp(jax.lax.scan(step, alpha0, y[1:])[0])

    return jax.vmap(one)(ys)


@pytest.mark.parametrize(
    "model, by_hand, trans",
    [
        (hmm_of_lengths, forward_of_lengths, [[0.8, 0.2], [0.3, 0.7]]),
        (
            second_order_hmm,
            second_order_forward,
            [[[0.9, 0.1], [0.4, 0.6]], [[0.2, 0.8], [0.5, 0.5]]],
        ),
    ],
    ids=["masked-steps", "second-order"],
)
def test_hmms_as_hmm_enum_writes_them_equal_their_forward_algorithm(
    model, by_hand, trans
):
    """A masked enumerated step keeps its transition (weighing each state by
    one would add log K per padded step), and ``history=2`` chains pairs."""
    fixed = {"trans": jnp.array(trans), "locs": jnp.array([-1.0, 1.0])}
    tr = trace(seed(numpyro.handlers.substitute(marginalized(model), fixed), 0))
    site = next(
        s
        for s in tr.get_trace(SEQUENCES).values()
        if s["type"] == "sample" and s["is_observed"]
    )
    for ys in (SEQUENCES, SEQUENCES[::-1] + 0.5):
        np.testing.assert_allclose(
            site["fn"].log_prob(jnp.reshape(ys, site["value"].shape)),
            by_hand(ys, fixed["trans"], fixed["locs"]),
            rtol=1e-5,
        )


def test_the_export_of_an_hmm_holds_the_model_s_own_observations():
    """``observed_data`` and ``posterior_predictive`` as the model observes
    them (time first along ``scan``, the plate of sequences named), the log
    likelihood per sequence; ``infer_discrete`` does not draw in ``scan``."""
    guide = AutoNormal(block(hmm_of_lengths, expose=["trans", "locs"]))
    exported = diagnostics.to_inference_data(
        random.PRNGKey(0), HMM_PARAMS, hmm_of_lengths, guide, SEQUENCES, num_draws=20
    )
    observed = diagnostics.get_group(exported, "observed_data")["y"]
    np.testing.assert_array_equal(observed.values, SEQUENCES.T)
    assert observed.dims == ("y_dim_0", "sequences")
    simulated = diagnostics.get_group(exported, "posterior_predictive")["y"]
    assert simulated.dims == ("chain", "draw", "y_dim_0", "sequences")
    assert simulated.shape == (1, 20, T, S)
    log_lik = diagnostics.get_group(exported, "log_likelihood")["y"]
    assert log_lik.dims == ("chain", "draw", "sequences")
    assert "infer_discrete" in exported.attrs["discrete_sites"]


def test_distances_to_the_data_do_not_see_masked_steps():
    """The energy score of padded sequences does not change with the values
    at the padding; the log score is the forward algorithm's at any padding."""
    guide = AutoNormal(block(hmm_of_lengths, expose=["trans", "locs"]))
    padded = jnp.arange(T)[None, :] >= LENGTHS[:, None]
    other = jnp.where(padded, 100.0, SEQUENCES)
    key = random.PRNGKey(3)
    options = {"num_draws": 100, "max_draws": 100, "moment_match": False}
    energy = [
        predictive_score(key, HMM_PARAMS, hmm_of_lengths, guide, ys, score="energy")
        for ys in (SEQUENCES, other)
    ]
    np.testing.assert_allclose(energy[0].score, energy[1].score, rtol=1e-6)
    assert np.all(np.isfinite(energy[0].score))
    a = predictive_score(key, HMM_PARAMS, hmm_of_lengths, guide, other, **options)
    reference = AutoNormal(lengths_by_hand)
    b = predictive_score(key, HMM_PARAMS, lengths_by_hand, reference, other, **options)
    np.testing.assert_allclose(a.score, b.score, rtol=1e-5)


# --------------------------------------------------------------------------
# procedures: cross-validation against TraceEnum_ELBO, VSBC, calibration
# --------------------------------------------------------------------------


@pytest.mark.slow
def test_cv_and_stacking_take_trace_enum_elbo_as_vi_and_equal_the_mixture():
    guide_enum, guide_sum = guides()
    fit = FitRecipe(num_steps=30, num_draws=50, progress_bar=False)
    candidates = {"pvi": PredictiveELBO(num_particles=4)}
    cvs = [
        cross_validate(
            random.PRNGKey(7),
            m,
            g,
            optax.adam(0.05),
            DATA,
            fit=fit,
            candidates=candidates,
            num_folds=3,
            rule="best",
        )
        for m, g in [(enumerated, guide_enum), (summed_out, guide_sum)]
    ]
    np.testing.assert_allclose(
        cvs[0].scores["pointwise"].values, cvs[1].scores["pointwise"].values, rtol=1e-4
    )
    key = random.PRNGKey(7)
    scores = []
    for m, g in [(enumerated, guide_enum), (summed_out, guide_sum)]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # NumPyro: discrete latent in SVI.init
            cv = cross_validate(key, m, g, optax.adam(0.05), DATA, fit=fit, num_folds=3)
            stacked = stack(key, m, g, optax.adam(0.05), DATA, cv=cv, fit=fit)
        scores.append(
            predictive_score(key, stacked.params, m, stacked.guide, DATA, num_draws=50)
        )
        if m is enumerated:  # TraceEnum_ELBO is the VI, and Trace_ELBO of the sum
            assert cv.reference == "VI"
            assert isinstance(cv.candidates["VI"], TraceEnum_ELBO)
    np.testing.assert_allclose(scores[0].score, scores[1].score, rtol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["pvi", "TraceEnum_ELBO"])
@pytest.mark.parametrize("procedure", ["vsbc", "predictive_calibration"])
def test_replications_simulate_the_assignments_and_fit_the_continuous_sites(
    procedure, loss
):
    guide_enum, _ = guides()
    replications = Replications(
        num_simulations=4, num_svi_steps=20, num_draws=20, progress_bar=False
    )
    objective = {
        "pvi": PredictiveELBO(num_particles=2),
        "TraceEnum_ELBO": TraceEnum_ELBO(),
    }
    run = getattr(diagnostics, procedure)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = run(
            random.PRNGKey(8), enumerated, guide_enum, optax.adam(0.05),
            objective[loss], DATA, replications=replications,
        )  # fmt: skip
    fit_stats = diagnostics.get_group(out, f"{procedure.split('_')[-1]}_fit_stats")
    assert np.isfinite(fit_stats["loss"].values).all()


# --------------------------------------------------------------------------
# NumPyro's toy mixture example (examples/toy_mixture_model_discrete_
# enumeration.py), as written: an observed site before the enumerated one
# --------------------------------------------------------------------------


def toy_summed_out(prior, obs, num_obs):
    """The example's model with ``B`` summed out by hand."""
    p_A = numpyro.sample("p_A", dist.Beta(1, 1))
    p_B = numpyro.sample("p_B", dist.Beta(jnp.ones(2), jnp.ones(2)).to_event(1))
    p_C = numpyro.sample("p_C", dist.Beta(jnp.ones(2), jnp.ones(2)).to_event(1))
    with numpyro.plate("data_plate", num_obs):
        A = numpyro.sample("A", dist.Bernoulli(p_A), obs=obs["A"])
        p_b = p_B[A]
        p_c = (1 - p_b) * p_C[0] + p_b * p_C[1]
        numpyro.sample("C", dist.Bernoulli(p_c), obs=obs["C"])


TOY = toy_mixture.data()[0]
toy_model, toy_guide = toy_mixture.model, toy_mixture.guide


def test_the_toy_example_fits_with_pvi_as_its_sum_written_by_hand():
    runs = [
        SVI(m, toy_guide, optax.adam(0.05), PACmELBO(num_particles=4)).run(
            random.PRNGKey(0), 30, *TOY, progress_bar=False
        )
        for m in (toy_model, toy_summed_out)
    ]
    np.testing.assert_allclose(runs[0].losses, runs[1].losses, rtol=1e-4)
    scores = [
        predictive_score(random.PRNGKey(1), runs[0].params, m, toy_guide, *TOY)
        for m in (toy_model, toy_summed_out)
    ]
    np.testing.assert_allclose(scores[0], scores[1], rtol=1e-5)


@pytest.mark.slow
def test_the_toy_example_is_cross_validated_against_trace_enum_elbo():
    candidates = {
        "VI": TraceEnum_ELBO(num_particles=4),
        "pvi": PredictiveELBO(num_particles=4),
    }
    cv = cross_validate(
        random.PRNGKey(2),
        toy_model,
        toy_guide,
        optax.adam(0.05),
        *TOY,
        fit=FitRecipe(num_steps=40, num_draws=100, progress_bar=False),
        candidates=candidates,
        num_folds=2,
    )
    assert cv.reference == "VI"
    assert np.isfinite(cv.scores["pointwise"].values).all()


# --------------------------------------------------------------------------
# an annotation model (examples/annotation.py's Dawid-Skene): the item plate
# at dim -2, each item's annotations along an inner plate
# --------------------------------------------------------------------------

POSITIONS = jnp.array([0, 1, 2])
ANNOTATIONS = jnp.array([[0, 0, 1], [1, 1, 1], [2, 0, 2], [1, 2, 2], [0, 0, 0]])


def _annotation_globals():
    with numpyro.plate("annotator", 3, dim=-2):
        with numpyro.plate("class", 3):
            beta = numpyro.sample("beta", dist.Dirichlet(jnp.ones(3)))
    pi = numpyro.sample("pi", dist.Dirichlet(jnp.ones(3)))
    return beta, pi


def dawid_skene(positions, annotations):
    beta, pi = _annotation_globals()
    with numpyro.plate("item", annotations.shape[0], dim=-2):
        c = numpyro.sample("c", dist.Categorical(pi), infer={"enumerate": "parallel"})
        with numpyro.plate("position", annotations.shape[1]):
            numpyro.sample(
                "y", dist.Categorical(Vindex(beta)[positions, c, :]), obs=annotations
            )


def dawid_skene_by_hand(positions, annotations):
    beta, pi = _annotation_globals()
    # (items, classes): log pi_c + sum_j log beta[position_j, c, y_ij]
    log_lik = jnp.log(beta[positions[None, :], :, annotations])  # (I, J, C)
    per_class = jnp.log(pi) + jnp.sum(log_lik, axis=1)
    with numpyro.plate("item", annotations.shape[0]):
        numpyro.factor("y", jax.nn.logsumexp(per_class, axis=-1))


def test_an_annotation_model_equals_its_sum_over_classes():
    guide = AutoNormal(block(dawid_skene, hide=["c"]))
    reference = AutoNormal(dawid_skene_by_hand)
    args = (POSITIONS, ANNOTATIONS)
    params = (
        SVI(dawid_skene, guide, optax.adam(0.05), TraceEnum_ELBO())
        .run(random.PRNGKey(0), 30, *args, progress_bar=False)
        .params
    )
    options = {"num_draws": 100, "max_draws": 100, "moment_match": False}
    a = predictive_score(
        random.PRNGKey(1), params, dawid_skene, guide, *args, **options
    )
    SVI(dawid_skene_by_hand, reference, optax.adam(0.05), TraceEnum_ELBO()).init(
        random.PRNGKey(0), *args
    )
    b = predictive_score(
        random.PRNGKey(1), params, dawid_skene_by_hand, reference, *args, **options
    )
    assert a.shape == (ANNOTATIONS.shape[0],)
    np.testing.assert_allclose(a, b, rtol=1e-5)
