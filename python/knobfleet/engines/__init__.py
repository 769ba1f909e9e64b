"""Engine adapters built from catalog data (how the model is passed, readiness, info endpoint, env prefixes)."""
