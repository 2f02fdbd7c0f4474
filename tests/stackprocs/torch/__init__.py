"""Stand-in `torch` package for py-spy tests; only the module path matters."""
