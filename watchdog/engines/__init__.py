"""Engine profiles: how each inference engine is recognised and read, kept as TOML data."""
