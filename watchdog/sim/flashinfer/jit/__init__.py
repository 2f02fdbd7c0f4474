"""Stand-in for `flashinfer.jit`; holds the simulated `cubin_loader` module."""
