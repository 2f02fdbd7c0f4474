"""The knowledge's schemas and loaders: signatures and their evidence rules, generic classes,
the operation table, rank rules and the published-versions record, each read from its TOML file
into typed data once (watchdog/knowledge.py bundles them) and checked as it is read."""
