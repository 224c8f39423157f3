"""The particle engine (private): a model replayed on a guide's draws, one
trace per particle, turned into the arrays every objective, score and
diagnostic reads. Modules import one another directly; the public side of
what it returns is :mod:`numpyro_pvi.particles`."""
