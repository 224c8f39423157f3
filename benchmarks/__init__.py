"""Benchmarks of numpyro-pvi (run from the repository root, e.g.
``python -m benchmarks.posteriordb``); not part of the package."""
