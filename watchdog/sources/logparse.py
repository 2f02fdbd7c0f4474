"""Turn one raw log line from vLLM (or FlashInfer, uvicorn, tqdm) into a typed LogEvent.

Pure: no I/O, no clock. Every regex here matches an upstream format quoted in
/work/shared/reference/domain.md or a real log excerpt under tests/data/logs/.
Matching is by `search`, so a message is recognised with or without vLLM's
`(APIServer pid=N) INFO MM-DD HH:MM:SS [file.py:N] ` prefix.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from watchdog.core.model import LogEvent

# CSI (colour, cursor moves), OSC (titles, ended by BEL or ST) and two-byte escapes.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")

# Outer prefixes added by whatever collected the log, stripped until none is left.
_OUTER_PREFIXES: tuple[re.Pattern[str], ...] = (
    # `docker logs -t` RFC3339Nano: `2026-05-12T07:54:39.312201059Z ` (tt-inference-server #3359)
    re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2}) "),
    # log viewer: `2025-05-30 09:55:22.281 | ` (vllm #18916)
    re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:[.,]\d+)? \| "),
    # journald short format: `Aug 19 18:34:27 vllm vllm[8727]: ` (ProxmoxVED #2047)
    re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \S+ [^\s\[\]:]+(?:\[\d+\])?: "),
    # docker-compose: `qwen3-vl-32b  | ` (vllm-ascend #5117)
    re.compile(r"^[A-Za-z0-9][\w.-]*\s+\| "),
    # BuildKit elapsed seconds, optionally after the step number: `51.22 ` (spark-vllm-docker #245)
    re.compile(r"^(?:#\d+ )?\d+\.\d+ "),
    # pdsh `host: ` (nccl #1029). Lowercase with a digit or hyphen, so that `RuntimeError: `,
    # `INFO: `, `flashinfer.jit: ` and `vllm.v1....EngineDeadError: ` are never taken for hosts.
    re.compile(r"^(?=[a-z0-9.-]*[\d-])[a-z0-9][a-z0-9.-]*: "),
)

# vLLM's process prefix (vllm/utils/system_utils.py `_add_prefix`): `(EngineCore_DP0 pid=123) `.
_PROC = re.compile(r"^\((?P<proc>[A-Za-z][\w.-]*) pid=(?P<pid>\d+)\) ?")

# --- stats: vllm/v1/metrics/loggers.py LoggingStatLogger.log, and V0 llm_engine.py ---
_STATS = re.compile(
    r"(?:Engine (?P<engine>\d+): |(?P<engines>\d+) Engines Aggregated: )?"
    r"Avg prompt throughput: (?P<prompt>[\d.]+) tokens/s, "
    r"Avg generation throughput: (?P<gen>[\d.]+) tokens/s, "
    r"Running: (?P<running>\d+) reqs, (?:Swapped: \d+ reqs, )?"
    r"(?:Waiting|Pending): (?P<waiting>\d+) reqs"
)
_KV = re.compile(r"GPU KV cache usage: (?P<kv>[\d.]+)%")

# --- tqdm bars (domain.md 2.3) ---
_BAR = re.compile(
    r"(?P<desc>[^|:]*?[^|:\s]):\s+(?P<pct>\d+)%\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+)"
    r" \[(?P<elapsed>[\d:]+)(?:<(?P<remaining>[^,\]]*))?(?:, (?P<rest>[^\]]*))?\]"
)
# tqdm without a total: `Processing batches: 2it [00:00,  4.69it/s]`
_BAR_NOTOTAL = re.compile(r"(?P<desc>[^|:]*?[^|:\s]): (?P<n>\d+)it \[(?P<elapsed>[\d:]+)[,\]]")
# vLLM weight_utils `_BAR_FORMAT`: "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} ..."
_LOADING = re.compile(
    r"(?P<desc>Loading [^:|]*?):\s+(?P<pct>\d+)% Completed \| (?P<n>\d+)/(?P<total>\d+)"
    r"(?: \[(?P<elapsed>[\d:]+))?"
)
_LOADING_DESC = re.compile(r"^Loading .*(?:checkpoint|shards|weights)", re.IGNORECASE)
_SPEED = re.compile(r"est\. speed input: (?P<inp>[\d.]+) toks/s, output: (?P<out>[\d.]+) toks/s")

# Simple kinds, one regex each: (kind, field, value, needle, pattern). The needle is a literal
# substring the line must contain before the regex is tried (keeps per-line cost low).
_Row = tuple[str, str, str, str, str]
_TABLE_SPEC: tuple[_Row, ...] = (
    # startup milestones (domain.md 2.3 "Startup milestones")
    ("milestone", "name", "weights_loaded", "Loading weights took",
     r"Loading weights took (?P<seconds>[\d.]+) seconds"),
    ("milestone", "name", "model_loaded", "Model loading took",
     r"Model loading took (?:(?P<gib>[\d.]+) ?GiB(?: memory)? and )?(?P<seconds>[\d.]+) seconds"),
    ("milestone", "name", "graph_captured", "Graph capturing finished",
     r"Graph capturing finished in (?P<seconds>[\d.]+) secs?(?:, took (?P<gib>[\d.]+) GiB)?"),
    ("milestone", "name", "engine_ready", "init engine (profile",
     r"init engine \(profile, create kv cache, warmup model\) took (?P<seconds>[\d.]+) seconds"),
    ("milestone", "name", "startup_complete", "Application startup complete.",
     r"Application startup complete\."),
    # "takes" in older vLLM (vllm #16301), "took" in newer (club-3090 #142)
    ("milestone", "name", "compile_done", "torch.compile t",
     r"torch\.compile (?:takes|took) (?P<seconds>[\d.]+) s in total"),
    # torch.compile activity (vllm compilation/backends.py)
    ("compile", "phase", "graph", "Compiling a graph for",
     r"Compiling a graph for (?P<shape>.+?)(?: takes (?P<seconds>[\d.]+) s)?$"),
    ("compile", "phase", "dynamo", "Dynamo bytecode transform time",
     r"Dynamo bytecode transform time: (?P<seconds>[\d.]+) s"),
    ("compile", "phase", "cache_load", "Directly load the compiled graph",
     r"Directly load the compiled graph.*?(?:, took (?P<seconds>[\d.]+) s)?$"),
    # version announcements (vllm api_server.py run_server, v1/engine/core.py, V0 llm_engine.py)
    ("version", "component", "api_server", "vLLM API server version",
     r"vLLM API server version (?P<version>\S+)"),
    ("version", "component", "engine", "LLM engine (v",
     r"Initializing (?:a V1|an) LLM engine \(v(?P<version>[^)\s]+)\) with config"),
    # vllm/utils/flashinfer.py use_trtllm_attention (domain.md 2.1): "Using TRTLLM %s attention
    # (auto-detected).", older "Using TRTLLM attention (auto-detected)." (vllm #25848), and
    # "Using TRTLLM attention (--attention-config.use_trtllm_attention is set to 1)".
    ("trtllm", "enabled", "", "Using TRTLLM",
     r"Using TRTLLM (?:(?P<phase>\w+) )?attention \((?P<reason>[^)]*)\)"),
)  # fmt: skip
_TABLE = tuple((k, f, v, n, re.compile(p)) for k, f, v, n, p in _TABLE_SPEC)
_FLOAT_FIELDS = frozenset({"seconds", "gib", "delay_s"})
_INT_FIELDS = frozenset({"attempt"})

# --- flashinfer.jit logger (domain.md 1.6; flashinfer/jit/cubin_loader.py) ---
_JIT = re.compile(r"flashinfer\.jit: (?P<msg>.*)$")
_JIT_SPEC: tuple[tuple[str, str], ...] = (
    # v0.6.7 `Fetching cubin X from URI` / `Fetching file from URI`; >= 0.6.7.post1
    # `Fetching X from URI`; some builds log `Fetching X` with no URI (flashinfer PR #4985).
    ("fetching", r"^Fetching (?:cubin |file )?(?:(?P<file>\S+?) )?(?:from (?P<uri>\S+))?\s*$"),
    ("lock", r"^Acquired lock for (?P<path>\S+)"),
    ("downloaded", r"^File downloaded successfully: (?P<uri>\S+) -> (?P<path>\S+)"),
    ("downloaded", r"^File copied successfully: (?P<path>\S+)"),
    (
        "attempt_failed",
        r"^Downloading (?P<uri>\S+): attempt (?P<attempt>\d+) failed: (?P<error>.*)$",
    ),
    ("retrying", r"^Retrying in (?P<delay_s>[\d.]+) seconds"),
    ("max_retries", r"^Max retries reached"),
    ("loading", r"^Loading from (?P<path>\S+)"),
    ("sha256_mismatch", r"^sha256 mismatch .*? for (?P<path>\S+)"),
)
_JIT_ACTIONS = tuple((action, re.compile(p)) for action, p in _JIT_SPEC)


def clean_line(raw: str) -> str:
    """The line without ANSI codes, NULs, trailing whitespace and collector prefixes."""
    line = raw.replace("\x00", "")
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    line = line.rstrip("\r\n")
    for _ in range(8):  # prefixes can stack (docker -t around compose); bounded, idempotent
        for pattern in _OUTER_PREFIXES:
            stripped = pattern.sub("", line, count=1)
            if stripped != line:
                line = stripped
                break
        else:
            break
    return line.rstrip()


def split_proc(line: str) -> tuple[str | None, int | None, str]:
    """vLLM's `(Proc pid=N) ` prefix as (proc, pid, message); (None, None, line) without one."""
    m = _PROC.match(line)
    if m is None:
        return None, None, line
    return m.group("proc"), int(m.group("pid")), line[m.end() :]


def parse_line(line: str, source: str = "", keep: re.Pattern[str] | None = None) -> LogEvent | None:
    """The LogEvent a line carries, a kind="line" event if `keep` matches it, else None."""
    text = clean_line(line)
    proc, pid, msg = split_proc(text)
    for parser in _PARSERS:
        found = parser(msg)
        if found is not None:
            kind, fields = found
            break
    else:
        if keep is None or not keep.search(text):
            return None
        kind, fields = "line", {}
    if proc is not None:
        fields["proc"] = proc
        fields["pid"] = pid
    return LogEvent(kind=kind, line=text, source=source, fields=fields)


def parse_elapsed(text: str) -> float | None:
    """tqdm's `MM:SS` or `H:MM:SS` (or `D:HH:MM:SS`) as seconds; None when malformed."""
    total = 0.0
    for part in text.split(":"):
        if not part.isdigit():
            return None
        total = total * 60 + int(part)
    return total


_Parsed = tuple[str, dict[str, Any]]


def _stats(msg: str) -> _Parsed | None:
    if "Avg prompt throughput" not in msg:
        return None
    m = _STATS.search(msg)
    if m is None:
        return None
    kv = _KV.search(msg, m.end())
    fields: dict[str, Any] = {
        "engine": int(m.group("engine")) if m.group("engine") else None,
        "aggregated": int(m.group("engines")) if m.group("engines") else None,
        "prompt_tps": float(m.group("prompt")),
        "gen_tps": float(m.group("gen")),
        "running": int(m.group("running")),
        "waiting": int(m.group("waiting")),
        "kv_usage": round(float(kv.group("kv")) / 100.0, 6) if kv else None,  # ratio 0-1
    }
    return "stats", fields


def _jit(msg: str) -> _Parsed | None:
    if "flashinfer.jit: " not in msg:
        return None
    m = _JIT.search(msg)
    if m is None:
        return None
    body = m.group("msg")
    fields: dict[str, Any] = {"action": "other", "message": body}
    for action, pattern in _JIT_ACTIONS:
        am = pattern.search(body)
        if am is not None:
            fields["action"] = action
            fields.update(_typed(am.groupdict()))
            break
    uri = fields.get("uri")
    if uri and "://" in uri:
        fields["host"] = urlsplit(uri).hostname
    return "jit", fields


def _table(msg: str) -> _Parsed | None:
    for kind, field_name, value, needle, pattern in _TABLE:
        if needle in msg:
            m = pattern.search(msg)
            if m is not None:
                fields = _typed(m.groupdict())
                fields[field_name] = value or True
                return kind, fields
    return None


def _typed(groups: dict[str, str | None]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for key, value in groups.items():
        if value is None:
            continue
        if key in _FLOAT_FIELDS:
            fields[key] = float(value)
        elif key in _INT_FIELDS:
            fields[key] = int(value)
        else:
            fields[key] = value
    return fields


def _bar_fields(m: re.Match[str]) -> dict[str, Any]:
    groups = m.groupdict()
    n = int(groups["n"])
    total = int(groups["total"]) if groups.get("total") else None
    fields: dict[str, Any] = {"desc": groups["desc"].strip(), "n": n, "total": total}
    fields["pct"] = float(groups["pct"]) if groups.get("pct") else None
    fields["elapsed_s"] = parse_elapsed(groups["elapsed"]) if groups.get("elapsed") else None
    return fields


def _bars(msg: str) -> _Parsed | None:
    if "it" not in msg and "Completed" not in msg:
        return None
    # Cheap substring guards first: the bar regexes scan from every position of the line.
    m = _LOADING.search(msg) if "% Completed |" in msg else None
    if m is not None:
        return "loading", _bar_fields(m)
    m = _BAR.search(msg) if "%|" in msg else None
    m = m or (_BAR_NOTOTAL.search(msg) if "it [" in msg else None)
    if m is None:
        return None
    fields = _bar_fields(m)
    desc = fields["desc"]
    if desc.startswith("Capturing CUDA graphs"):
        return "capture", fields
    if _LOADING_DESC.search(desc):
        return "loading", fields
    speed = _SPEED.search(msg, m.start())
    if speed is not None:
        fields["input_tps"] = float(speed.group("inp"))
        fields["output_tps"] = float(speed.group("out"))
    return "progress", fields


# Order matters only where texts overlap: stats and jit lines are the most specific.
_PARSERS: tuple[Callable[[str], _Parsed | None], ...] = (_stats, _jit, _table, _bars)


def literal_keys() -> tuple[str, ...]:
    """Substrings one of which every line that yields a parsed event contains (each parser's
    guard above): the log source's prefilter skips lines holding none of them unparsed."""
    return (
        "Avg prompt throughput",  # _stats
        "flashinfer.jit: ",  # _jit
        *(needle for _kind, _field, _value, needle, _pattern in _TABLE),
        "% Completed |",  # _bars: _LOADING
        "%|",  # _bars: _BAR
        "it [",  # _bars: _BAR_NOTOTAL
    )
