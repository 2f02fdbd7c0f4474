"""A stand-in for the `flashinfer` package, laid out like upstream so py-spy shows the same frames.

Only `flashinfer.jit.cubin_loader` is simulated: the cubin download path that can stall a
vLLM engine (domain.md 1.4). Import it as `watchdog.sim.flashinfer.jit.cubin_loader`.
"""
