"""Test helper: the options of a procedure that fits, split into its
:class:`~numpyro_pvi.Replications` and the rest."""

from numpyro_pvi import Replications

FIELDS = frozenset(Replications.__dataclass_fields__)


def with_replications(options: dict, **defaults) -> dict:
    """``options`` with its replication fields (over ``defaults``) moved
    into ``replications=Replications(...)``."""
    fields = {**defaults, **{k: v for k, v in options.items() if k in FIELDS}}
    rest = {k: v for k, v in options.items() if k not in FIELDS}
    return {**rest, "replications": Replications(**fields)}
