"""Command line of the simulated vLLM: known options, and vLLM-style flags accepted and ignored.

Unknown `--flag`/`--flag=value` arguments are ignored on purpose, so a restarter can append
real vLLM flags (e.g. `--attention-config.use_trtllm_attention=0`) to the sim's command line.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

SCENARIOS = (
    "healthy",
    "cubin_download_stall",
    "kernel_deadlock",
    "slow_loading",
    "engine_dead",
    "hang_unless_fallback",
    "collective_wait",
)
ROLE_API = "api"
ROLE_ENGINE = "VLLM::EngineCore"
ENGINES = ("vllm", "sglang", "trtllm")
# trtllm-serve's executor worker: spawned by MpiPoolSession (tensorrt_llm/llmapi/mpi_session.py)
# through mpi4py's MPIPoolExecutor, whose workers run `python -m mpi4py.futures.server` (mpi4py
# 4.0.3 futures/_core.py client_spawn); TensorRT-LLM sets no process title.
ROLE_TRTLLM_WORKER = "mpi4py.futures.server"
# SGLang's scheduler and detokenizer titles (srt/managers/scheduler.py configure_scheduler_process,
# srt/managers/detokenizer_manager.py; sglang 0.5.23): no suffix at TP=1.
ROLE_SGLANG_SCHEDULER = "sglang::scheduler"
ROLE_SGLANG_DETOKENIZER = "sglang::detokenizer"
FALLBACK_FLAG = "--attention-config.use_trtllm_attention"
# SGLang: --attention-backend (srt/arg_groups/fields/exec_.py); trtllm_mha is its SM100/SM103
# default, any other backend avoids FlashInfer's TRTLLM-gen kernels and their cubins.
SGLANG_BACKEND_FLAG = "--attention-backend"
FALSE_WORDS = ("0", "false", "False", "no")


@dataclass(frozen=True)
class SimConfig:
    """Everything one simulated process needs; every process of the tree parses the same argv."""

    scenario: str = "healthy"
    mode: str = "serve"
    role: str = ROLE_API
    port: int = 0
    port_file: str | None = None
    stats_interval: float = 2.0
    load: int = 4
    num_prompts: int = 768
    bench_s: float = 3.0
    startup_s: float = 3.0
    shards: int = 4
    shard_s: float = 5.0
    die_after_s: float = 2.0
    load_s: float = 0.0
    silence_s: float = 0.0
    gpu_file: str | None = None
    gpus: int = 1
    gpu_name: str = "NVIDIA GB300"
    cc: str = "10.3"
    tp: int = 1
    hang_rank: int = -1
    cdn_url: str | None = None
    cdn_timeout: float = 600.0
    log_file: str | None = None
    fake_versions: str = ""
    workdir: str | None = None
    model: str = "sim/Llama-3.1-8B-Instruct"
    status_fd: int = -1
    trtllm_disabled: bool = False
    engine: str = "vllm"
    health_timeout_s: float = 20.0
    hang_detector_s: float = 300.0
    argv: tuple[str, ...] = field(default_factory=tuple)

    @property
    def engine_role(self) -> str:
        """The title of the process that steps the batch for this engine (SGLang: TP rank 0)."""
        if self.engine == "sglang":
            return sglang_scheduler_title(0, self.tp)
        if self.engine == "trtllm":
            return ROLE_TRTLLM_WORKER
        return ROLE_ENGINE


def sglang_scheduler_title(rank: int, tp: int) -> str:
    """`sglang::scheduler` at TP=1, `sglang::scheduler_TP<rank>` at TP>1.

    srt/managers/scheduler.py configure_scheduler_process (sglang 0.5.23): the title is
    "sglang::scheduler" + the log prefix with spaces as underscores, and the prefix has
    " TP<rank>" only when tp_size > 1 (no DP/PP/EP here: their sizes are 1).
    """
    return ROLE_SGLANG_SCHEDULER + (f"_TP{rank}" if tp > 1 else "")


def sglang_rank_of(role: str) -> int | None:
    """The TP rank in a `sglang::scheduler_TP<n>` title, else None."""
    match = re.fullmatch(re.escape(ROLE_SGLANG_SCHEDULER) + r"_TP(\d+)", role)
    return int(match.group(1)) if match else None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m watchdog.sim.vllm_sim",
        description="Simulated vLLM server for hang-watchdog demos and tests.",
    )
    p.add_argument("--scenario", choices=SCENARIOS, default="healthy")
    p.add_argument("--mode", choices=("serve", "bench"), default="serve")
    p.add_argument("--role", default=ROLE_API, help=argparse.SUPPRESS)
    p.add_argument("--status-fd", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help="HTTP port on 127.0.0.1 (0 = pick)")
    p.add_argument("--port-file", help="also write the chosen port to this file")
    p.add_argument("--stats-interval", type=float, default=2.0, help="Engine 000 line period (s)")
    p.add_argument("--load", type=int, default=4, help="serve: background requests in flight")
    p.add_argument("--num-prompts", type=int, default=768, help="bench: prompts to process")
    p.add_argument("--bench-s", type=float, default=3.0, help="bench: healthy run length (s)")
    p.add_argument("--startup-s", type=float, default=3.0, help="compressed startup length (s)")
    p.add_argument("--shards", type=int, default=4, help="weight shards to load")
    p.add_argument("--shard-s", type=float, default=5.0, help="slow_loading: seconds per shard")
    p.add_argument("--die-after-s", type=float, default=2.0, help="engine_dead: healthy seconds")
    p.add_argument(
        "--silence-s", type=float, default=0.0,
        help="serve: after 5 s of serving the engine goes silent this long, then serves again",
    )  # fmt: skip
    p.add_argument(
        "--load-s", type=float, default=0.0,
        help="serve: the background load drains after this many seconds (0: it never does)",
    )  # fmt: skip
    p.add_argument("--gpu-file", help="append simulated GPU samples (JSON Lines) here")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--gpu-name", default="NVIDIA GB300")
    p.add_argument("--cc", default="10.3", help="compute capability reported for the GPUs")
    p.add_argument("--tp", "--tensor-parallel-size", type=int, default=1, dest="tp")
    p.add_argument(
        "--hang-rank",
        type=int,
        default=-1,
        help="TP>1: this worker rank (SGLang: scheduler rank) downloads (cubin_download_stall) "
        "or spins (kernel_deadlock) while the other ranks wait in all_reduce",
    )
    p.add_argument("--cdn-url", help="stand-in cubin CDN base URL (must be loopback)")
    p.add_argument("--cdn-timeout", type=float, default=600.0, help="per-attempt HTTP timeout")
    p.add_argument("--log-file", help="also append every output line here")
    p.add_argument("--fake-versions", default="", help="e.g. vllm=0.11.0,flashinfer-python=0.6.7")
    p.add_argument("--workdir", help="scratch directory (default: a new temp dir)")
    p.add_argument("--model", default="sim/Llama-3.1-8B-Instruct")
    p.add_argument("--api-key", help="accepted like vLLM's (a secret on the command line)")
    p.add_argument(
        "--engine", choices=ENGINES, default="vllm", help="whose formats, metrics and titles"
    )
    p.add_argument(
        "--health-timeout-s", type=float, default=20.0,
        help="sglang: seconds /health waits for a generation (SGLANG_HEALTH_CHECK_TIMEOUT)",
    )  # fmt: skip
    p.add_argument(
        "--hang-detector-s", type=float, default=300.0,
        help="trtllm: HangDetector timeout (s) before the executor dumps stacks and kills itself",
    )  # fmt: skip
    return p


def trtllm_disabled(extra: Sequence[str], env: Mapping[str, str]) -> bool:
    """True when TRTLLM attention is turned off: vLLM's flag or legacy env var, SGLang's
    --attention-backend, or TensorRT-LLM's TLLM_FMHA_LIBS without flashinfer_trtllm_gen.

    Flag: `--attention-config.use_trtllm_attention=0` (flashinfer #2939); env
    `VLLM_USE_TRTLLM_ATTENTION` (pre-v0.14 name, vLLM PR #26315): anything but 1/true is False.
    """
    if env.get("VLLM_USE_TRTLLM_ATTENTION", "").strip() in FALSE_WORDS:
        return True
    if env.get("TLLM_FMHA_LIBS", "").strip():
        from watchdog.sim.trtllm import trtllm_gen_disabled

        return trtllm_gen_disabled(env)  # TensorRT-LLM: fmha/registry.py
    backend = _flag_value(extra, SGLANG_BACKEND_FLAG)
    if backend is not None:
        return backend != "trtllm_mha"
    for i, arg in enumerate(extra):
        if arg.startswith(FALLBACK_FLAG + "="):
            return arg.split("=", 1)[1] in FALSE_WORDS
        if arg == FALLBACK_FLAG and i + 1 < len(extra):
            return extra[i + 1] in FALSE_WORDS
    return False


def _flag_value(extra: Sequence[str], flag: str) -> str | None:
    """The last value of `--flag X` or `--flag=X` (argparse's last-wins rule)."""
    value = None
    for i, arg in enumerate(extra):
        if arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
        elif arg == flag and i + 1 < len(extra):
            value = extra[i + 1]
    return value


def parse(argv: Sequence[str], env: Mapping[str, str] | None = None) -> SimConfig:
    """Parse argv (unknown vLLM flags ignored); exits 2 with a clear message on a bad value."""
    env = os.environ if env is None else env
    ns, extra = _parser().parse_known_args(list(argv))
    for name in ("load", "num_prompts", "gpus", "tp", "shards"):
        low = 0 if name == "load" else 1
        if getattr(ns, name) < low:
            flag = "--" + name.replace("_", "-")
            _parser().error(f"{flag} must be >= {low} (got {getattr(ns, name)})")
    if ns.engine != "vllm" and ns.mode != "serve":
        _parser().error(f"--engine {ns.engine} is simulated in serve mode only (no bench CLI)")
    if ns.engine == "trtllm" and ns.tp > 1:
        _parser().error("--engine trtllm is simulated with --tp 1 only")
    values = {k: v for k, v in vars(ns).items() if k in SimConfig.__dataclass_fields__}
    return SimConfig(**values, trtllm_disabled=trtllm_disabled(extra, env), argv=tuple(argv))
