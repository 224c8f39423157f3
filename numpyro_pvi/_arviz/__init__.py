"""ArviZ's containers and numerics for either generation (private): the
adapters that build ``InferenceData`` or ``DataTree`` groups, and ArviZ's
Pareto smoothing and LOO apart from any container."""
