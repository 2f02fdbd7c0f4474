"""Laid out as `torch/...` so a dump shows the module path a real rank shows (torch/distributed)."""
