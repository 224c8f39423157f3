"""The first HMM of NumPyro's ``hmm_enum`` example: per sequence a hidden
state along ``scan``, marked for enumeration, emits the 0/1 notes of a plate
of tones; sequences of different lengths padded and masked past their
length; the transition and emission probabilities drawn from Dirichlet and
Beta priors."""

import types

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.contrib.control_flow import scan
from numpyro.handlers import block, mask
from numpyro.infer import TraceEnum_ELBO
from numpyro.infer.autoguide import AutoNormal

SOURCE = "pyro-ppl/numpyro examples/hmm_enum.py (model_1), commit 0b935d48"
TRAITS = (
    "enumerated discrete site along scan",
    "masked padding",
    "observations in two plates",
    "Python on its arguments",
)
#: the VI of an enumerated model
VI = TraceEnum_ELBO


def model(sequences, lengths, args, include_prior=True):
    num_sequences, max_length, data_dim = sequences.shape
    with mask(mask=include_prior):
        probs_x = numpyro.sample(
            "probs_x", dist.Dirichlet(0.9 * jnp.eye(args.hidden_dim) + 0.1).to_event(1)
        )
        probs_y = numpyro.sample(
            "probs_y",
            dist.Beta(0.1, 0.9).expand([args.hidden_dim, data_dim]).to_event(2),
        )

    def transition_fn(carry, y):
        x_prev, t = carry
        with numpyro.plate("sequences", num_sequences, dim=-2):
            with mask(mask=(t < lengths)[..., None]):
                x = numpyro.sample(
                    "x",
                    dist.Categorical(probs_x[x_prev]),
                    infer={"enumerate": "parallel"},
                )
                with numpyro.plate("tones", data_dim, dim=-1):
                    numpyro.sample("y", dist.Bernoulli(probs_y[x.squeeze(-1)]), obs=y)
        return (x, t + 1), None

    x_init = jnp.zeros((num_sequences, 1), dtype=jnp.int32)
    # NB swapaxes: we move time dimension of `sequences` to the front to scan over it
    scan(transition_fn, (x_init, 0), jnp.swapaxes(sequences, 0, 1))


def make_guide(model):
    return AutoNormal(block(model, hide=["x"]))


ARGS = types.SimpleNamespace(hidden_dim=3)


def data(seed=0, num_sequences=8, max_length=6, data_dim=4):
    """Notes of a sticky two-regime chain, in padded sequences of lengths 2
    to ``max_length``."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, max_length + 1, num_sequences)
    regime = np.cumsum(rng.random((num_sequences, max_length)) < 0.2, axis=1) % 2
    on = np.where(regime[..., None] == 1, 0.7, 0.1)
    notes = rng.random((num_sequences, max_length, data_dim)) < on
    notes &= np.arange(max_length)[None, :, None] < lengths[:, None, None]
    return (jnp.asarray(notes, jnp.int32), jnp.asarray(lengths), ARGS), {}


def held_out(seed=1):
    return data(seed, num_sequences=5)
