"""A stand-in laid out like `torch`, so a py-spy dump of a deadlocked simulator shows a
`synchronize` frame in `torch_stub/cuda/__init__.py`, as a real one shows torch/cuda."""
