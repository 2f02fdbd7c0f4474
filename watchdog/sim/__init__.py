"""A simulated vLLM server and a stand-in kernel CDN for demos and end-to-end tests.

`python -m watchdog.sim.vllm_sim` prints vLLM's log formats, serves vLLM's metric names and
reproduces hang scenarios with a real process tree; `python -m watchdog.sim.cdn` stands in for
FlashInfer's cubin CDN on 127.0.0.1. Nothing here runs at import.
"""
