"""Profiles: typed, versioned knob sets (model), their loading (loader), catalogs and the lock (store)."""
