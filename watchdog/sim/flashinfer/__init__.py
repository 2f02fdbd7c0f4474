"""A stand-in for the `flashinfer` package, laid out like upstream so py-spy shows the same frames.

Only `flashinfer.jit.cubin_loader` is simulated: the cubin download path that can stall a
vLLM engine (flashinfer-ai/flashinfer v0.6.7, flashinfer/jit/cubin_loader.py). Import it as
`watchdog.sim.flashinfer.jit.cubin_loader`.
"""
