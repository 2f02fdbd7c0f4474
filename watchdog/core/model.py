"""The data that flows one way through the watchdog: sources -> Observation -> Window -> Verdict.

Every type here is a frozen dataclass that round-trips through plain JSON (`to_dict` /
`from_dict`), so a recorded timeline can be replayed through the same pure classifier.
Times are `t` (monotonic seconds, for intervals) and `wall` (Unix seconds, for humans).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from watchdog.core.states import State

# States are part of the public contract (docs/signatures-and-engines.md, "The loop and the
# states"): the enum's order is the order of the `hang_watchdog_state` series.
STATES: tuple[str, ...] = tuple(s.value for s in State)
HANG_STATES = frozenset({State.HUNG.value, State.DEAD.value})


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one instant. A field the source could not read is None."""

    index: int
    uuid: str | None = None
    name: str | None = None
    cc: str | None = None  # compute capability "major.minor", e.g. "10.3" on GB300
    sm: float | None = None  # SM utilisation, ratio 0-1
    dram: float | None = None  # DRAM bandwidth utilisation, ratio 0-1
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    procs: int | None = None  # compute processes on the GPU; None when unknown
    pids: tuple[int, ...] = ()  # host PIDs of those processes (NVML reports host PIDs)
    method: str = (
        ""  # what produced sm/dram: "gpm", "utilization_rates", "dcgm_prof", "dcgm_dev", "file"
    )
    # The board's enforced power limit and the SM clock's maximum: with power_w and
    # sm_clock_mhz they judge a spin where no DRAM figure exists (GB10, GeForce without GPM).
    power_limit_w: float | None = None
    sm_clock_max_mhz: float | None = None
    # Tensor-core activity, ratio 0-1 (GPM ANY_TENSOR_UTIL, DCGM PIPE_TENSOR_ACTIVE): a kernel
    # issuing MMAs is computing, whatever its DRAM figure says. None where not reported.
    tensor: float | None = None


@dataclass(frozen=True)
class LogEvent:
    """One parsed log line. `kind` says which parser recognised it; `line` is the cleaned text.

    kinds: "progress" (a tqdm bar: desc, n, total, pct, elapsed_s), "stats" (vLLM's
    `Engine 000:` line: prompt_tps, gen_tps, running, waiting), "loading" (weight-shard bar:
    n, total), "capture" (CUDA-graph capture bar: n, total), "milestone" (name), "jit"
    (a `flashinfer.jit:` line: action), "compile" (torch.compile), "version" (vllm version),
    "trtllm" (TRTLLM attention in use: enabled), "line" (anything else kept for signatures),
    "stack" (a stack dump found in the log: `stack` holds it; fields: format, pid, title,
    stream, exception).
    """

    kind: str
    line: str
    source: str = ""
    fields: dict[str, Any] = field(default_factory=dict)
    stack: StackSample | None = None  # kind "stack" only: the dump, typed


@dataclass(frozen=True)
class ServerSample:
    """One scrape of the server's /metrics and /health."""

    up: bool  # /metrics answered and parsed
    health_status: int | None = None  # HTTP status of /health; None when it did not answer
    # What the engine profile says that status means: "ok", "dead", "starting",
    # "not_generating" (SGLang's one-token /health check got no answer); None when undeclared.
    health_meaning: str | None = None
    # The engine profile maps its own sample names to these fields (vLLM's named here).
    iterations: float | None = None  # vllm:iteration_tokens_total_count (one per engine step)
    prompt_tokens: float | None = None  # vllm:prompt_tokens_total, sglang:prompt_tokens_total
    generation_tokens: float | None = None  # vllm:generation_tokens_total
    running: float | None = None  # vllm:num_requests_running, sglang:num_running_reqs
    waiting: float | None = None  # vllm:num_requests_waiting, sglang:num_queue_reqs
    # Connections to the server's port holding a request with no answer yet, read from the
    # kernel's socket table (sources/tcpdiag.py); None when it could not be read.
    unanswered: int | None = None
    unanswered_oldest_s: float | None = None
    error: str | None = None
    # /health failed only while our own /metrics scrape was in flight and answered when probed
    # alone (sources/starvation.py): a note, never a failing health check; True while the
    # scrape is backed off for it.
    probe_starvation: bool = False


@dataclass(frozen=True)
class ProcInfo:
    """One process of the server's tree."""

    pid: int
    ppid: int
    name: str
    title: str  # process title / command line, e.g. "VLLM::EngineCore"
    cpu_s: float | None = None
    read_bytes: int | None = None
    status: str = ""
    role: str = ""  # what the engine profile calls this process, e.g. "scheduler", "worker"
    rank: int | None = None  # its rank, read from the title by the engine profile


@dataclass(frozen=True)
class ProcSnapshot:
    """The target and its whole tree."""

    target_pid: int | None
    alive: bool
    procs: tuple[ProcInfo, ...] = ()
    compilers: tuple[str, ...] = ()  # names of live compiler children: nvcc, ninja, cicc, ptxas
    restarted: bool = False  # the target came back under a new PID this tick
    engine: str = ""  # engine profile in force ("unknown": generic signals only; "": not known)


@dataclass(frozen=True)
class Connection:
    """A TCP socket from the server's tree to a kernel-CDN host."""

    pid: int
    host: str
    ip: str
    port: int
    state: str  # psutil's CONN_* name, e.g. "ESTABLISHED", "SYN_SENT"
    age_s: float  # how long the watchdog has seen this socket
    # tcp_info's tcpi_bytes_received (NETLINK_SOCK_DIAG); None when the kernel did not say
    bytes_received: int | None = None


@dataclass(frozen=True)
class Frame:
    """One Python (or native) stack frame, innermost first within a thread."""

    name: str
    filename: str = ""
    line: int = 0
    module: str = ""


@dataclass(frozen=True)
class ThreadStack:
    thread_id: int
    name: str
    frames: tuple[Frame, ...]
    active: bool = False
    unchanged: bool = False  # identical in two dumps taken an interval apart
    held: int = 0  # outermost frames (same function and file) both dumps share


@dataclass(frozen=True)
class StackSample:
    """The stacks of one process, or why they could not be taken."""

    pid: int
    title: str
    threads: tuple[ThreadStack, ...] = ()
    error: str | None = None  # e.g. "py-spy not found", "permission denied", "timed out"
    fix: str | None = None  # what the operator can do about `error`


@dataclass(frozen=True)
class CanaryResult:
    """The idle canary's answer to its one `max_tokens: 1` completion (sources/canary.py).

    `timed_out`: no answer within `waited_s`, so the request is work pending since it was
    sent; any other outcome (an answer, an error status) is the server answering."""

    timed_out: bool
    waited_s: float = 0.0
    result: str = ""  # "ok", "timeout" or "error: ..."


def canary_from_logs(logs: tuple[LogEvent, ...]) -> CanaryResult | None:
    """The canary's answer as releases before its own field recorded it: a log event of kind
    `canary` (fields timed_out, waited_s) injected into the observation; the last one wins."""
    found = None
    for ev in logs:
        if ev.kind == "canary":
            f = ev.fields
            found = CanaryResult(
                timed_out=bool(f.get("timed_out")),
                waited_s=float(f.get("waited_s") or 0.0),
                result=ev.line.removeprefix("canary completion: "),
            )
    return found


@dataclass(frozen=True)
class Observation:
    """Everything the sources saw in one tick. A source that is down contributes nothing."""

    # Keys written by older releases, read under their new names (timelines and bundles
    # recorded before the server sample stopped being called `vllm` still replay).
    RENAMED: ClassVar[dict[str, str]] = {"vllm": "server"}

    t: float
    wall: float
    gpus: tuple[GpuSample, ...] = ()
    logs: tuple[LogEvent, ...] = ()
    server: ServerSample | None = None
    procs: ProcSnapshot | None = None
    conns: tuple[Connection, ...] = ()
    stacks: tuple[StackSample, ...] = ()
    facts: dict[str, Any] = field(
        default_factory=dict
    )  # environment facts, e.g. {"flashinfer": "0.6.7"}
    sources: dict[str, bool] = field(default_factory=dict)  # source name -> up
    # Log lines the log source left unparsed since the watchdog started, by reason (only
    # reasons that occurred): the metrics hook exports the increases.
    log_skipped: dict[str, int] = field(default_factory=dict)
    # NCCL's own view (sources/nccl_ras.py): the latest RAS result, None when not queried.
    nccl_ras: dict[str, Any] | None = None
    # The idle canary's answer this tick (sources/canary.py); None when none came back.
    canary: CanaryResult | None = None

    def __post_init__(self) -> None:
        # Timelines recorded before the canary had its own field carried its answer as a log
        # event of kind `canary`: read there, it lands in the field (the event stays a line).
        if self.canary is None and self.logs:
            object.__setattr__(self, "canary", canary_from_logs(self.logs))
        # Timelines and bundles recorded before RAS had its own field carried it as the fact
        # `nccl_ras`: read there, it lands in the field, so old recordings replay the same.
        if self.nccl_ras is None and isinstance(self.facts.get("nccl_ras"), dict):
            facts = dict(self.facts)
            object.__setattr__(self, "nccl_ras", facts.pop("nccl_ras"))
            object.__setattr__(self, "facts", facts)


@dataclass(frozen=True)
class Evidence:
    """One fact that supported a verdict, named by the source it came from."""

    source: str  # "gpu", "log", "server", "procs", "conns", "stacks", "facts"
    kind: str  # the evidence kind from the signature data, e.g. "gpu_spin", "log", "stack"
    detail: str  # human-readable, e.g. "GPU 0 SM 0.99 DRAM 0.00 for 18 s"
    weight: float = 0.0


@dataclass(frozen=True)
class RankView:
    """What one process of the server was doing when a verdict was taken (core/judge/ranks.py)."""

    pid: int
    role: str = ""  # e.g. "Worker", "EngineCore", "scheduler"
    rank: int | None = None
    title: str = ""
    frame: str = ""  # innermost meaningful frame, e.g. "download_file (cubin_loader.py:88)"
    activity: str = ""  # download | gpu_wait | collective | other | no_stacks
    unchanged: bool | None = None  # that thread was identical in two dumps; None: one dump
    gpu: int | None = None  # GPU index whose compute processes include this pid
    sockets: tuple[str, ...] = ()  # "host:port STATE" of its kernel-CDN sockets
    part: str = ""  # "cause" (keeps its peers waiting), "waiting" (waits on the cause), ""


@dataclass(frozen=True)
class RankProgress:
    """When one rank last showed progress of its own (core/state/rankprogress.py)."""

    rank: int
    pid: int
    role: str = ""
    seconds: float = 0.0  # since that rank's last progress
    signal: str = "server"  # what showed it: server | idle | gpu | stack | log | nccl_ras


@dataclass(frozen=True)
class Verdict:
    """What classify() concluded about a window."""

    state: str
    signature: str | None = None
    title: str = ""
    confidence: float = 0.0
    evidence: tuple[Evidence, ...] = ()
    fix: str = ""
    commands: tuple[str, ...] = ()
    references: tuple[str, ...] = ()
    fallback: str | None = None
    suspicious: bool = False  # no progress with work pending: time to take stacks
    seconds_since_progress: float | None = None
    progress_ratio: float | None = None
    reason: str = ""  # one line on why this state, for non-hang states too
    priority: int = 0  # the signature's priority: the highest across nodes is the root cause
    ranks: tuple[RankView, ...] = ()  # per process of the server, when stacks were taken
    cause_rank: int | None = None  # the rank that keeps the others waiting
    cause_role: str = ""  # the role of the process that is the cause (also when rankless)
    waiting_ranks: tuple[int, ...] = ()  # ranks waiting on the cause
    rank_progress: tuple[RankProgress, ...] = ()  # each rank's own last progress
    engine: str = ""  # the engine watched and its version, e.g. "sglang 0.5.23"; "" unknown
    witnesses: tuple[str, ...] = ()  # what said work was pending (stats line, /health, stacks...)

    @property
    def is_hang(self) -> bool:
        return self.signature is not None and self.state in HANG_STATES


T = TypeVar("T")


def to_dict(obj: Any) -> Any:
    """A dataclass tree as plain JSON-able data."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_dict(v) for k, v in obj.items()}
    return obj


def from_dict(cls: type[T], data: Any) -> T:
    """Rebuild a dataclass written by `to_dict`; unknown keys are ignored (forward compatible)."""
    return typing.cast(T, _decode(cls, data))


_LEAVES: dict[Any, tuple[type, ...]] = {
    int: (int,),
    float: (int, float),
    str: (str,),
    bool: (bool,),
}


def _decode(tp: Any, data: Any) -> Any:
    if data is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _decode(args[0], data) if len(args) == 1 else data
    if origin is tuple:
        if not isinstance(data, (list, tuple)):
            raise TypeError(f"expected a list, got {type(data).__name__}")
        (item,) = typing.get_args(tp)[:1]
        return tuple(_decode(item, v) for v in data)
    if origin is dict:
        if not isinstance(data, dict):
            raise TypeError(f"expected an object, got {type(data).__name__}")
        return dict(data)
    if tp in _LEAVES:
        # A recorded timeline is input: a string where a number belongs must fail here, with
        # the line named, not later inside the classifier.
        ok = _LEAVES[tp]
        if not isinstance(data, ok) or (tp is not bool and isinstance(data, bool)):
            raise TypeError(f"expected {tp.__name__}, got {type(data).__name__} {data!r:.40}")
        return data
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        renamed = getattr(tp, "RENAMED", {})
        if renamed and isinstance(data, dict):
            data = {
                renamed.get(k, k) if renamed.get(k, k) not in data else k: v
                for k, v in data.items()
            }
        if not isinstance(data, dict):
            raise TypeError(f"expected an object for {tp.__name__}, got {type(data).__name__}")
        hints = typing.get_type_hints(tp)
        kwargs = {
            f.name: _decode(hints[f.name], data[f.name])
            for f in dataclasses.fields(tp)
            if f.name in data
        }
        return tp(**kwargs)
    return data
