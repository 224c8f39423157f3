"""The Dawid–Skene model of NumPyro's ``annotation`` example (its default):
each item's true class, marked for enumeration, selects per annotator a
confusion row from which each of the item's annotations is drawn; the
annotations observed in an inner plate of positions."""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.handlers import block
from numpyro.infer import TraceEnum_ELBO
from numpyro.infer.autoguide import AutoNormal
from numpyro.ops.indexing import Vindex

SOURCE = "pyro-ppl/numpyro examples/annotation.py (dawid_skene), commit 0b935d48"
TRAITS = (
    "enumerated discrete site",
    "observations in two plates",
    "Python on its arguments",
)
#: the VI of an enumerated model
VI = TraceEnum_ELBO


def model(positions, annotations):
    """
    This model corresponds to the plate diagram in Figure 2 of reference [1].
    """
    num_annotators = int(np.max(positions)) + 1
    num_classes = int(np.max(annotations)) + 1
    num_items, num_positions = annotations.shape

    with numpyro.plate("annotator", num_annotators, dim=-2):
        with numpyro.plate("class", num_classes):
            beta = numpyro.sample("beta", dist.Dirichlet(jnp.ones(num_classes)))

    pi = numpyro.sample("pi", dist.Dirichlet(jnp.ones(num_classes)))

    with numpyro.plate("item", num_items, dim=-2):
        c = numpyro.sample("c", dist.Categorical(pi), infer={"enumerate": "parallel"})

        # here we use Vindex to allow broadcasting for the second index `c`
        # ref: http://num.pyro.ai/en/latest/utilities.html#numpyro.contrib.indexing.vindex
        with numpyro.plate("position", num_positions):
            numpyro.sample(
                "y", dist.Categorical(Vindex(beta)[positions, c, :]), obs=annotations
            )


def make_guide(model):
    return AutoNormal(block(model, hide=["c"]))


#: the example's annotators: the first assessed each item three times
POSITIONS = np.array([1, 1, 1, 2, 3, 4, 5]) - 1


def data(seed=0, num_items=45):
    """Items of four classes, annotated by five annotators who are right
    with probability 0.4 to 0.8 (the example's shapes: 45 items, 7
    annotations each)."""
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, 4, num_items)
    skill = np.linspace(0.4, 0.8, 5)[POSITIONS]
    right = rng.random((num_items, len(POSITIONS))) < skill
    guess = rng.integers(0, 4, (num_items, len(POSITIONS)))
    annotations = np.where(right, truth[:, None], guess)
    annotations[0] = np.arange(len(POSITIONS)) % 4  # every class is seen
    return (POSITIONS, annotations), {}


def held_out(seed=1):
    return data(seed, num_items=20)
