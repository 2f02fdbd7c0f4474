"""The daemon: the loop that polls the sources, classifies and runs the hooks, and its wiring."""
