"""The line formats of stack dumps that appear in logs, and the engine prefixes around them.

Read from upstream (see watchdog/sources/logs/stackdumps.py for the formats and their sources).
Every
regex is anchored and bounded, so a hostile line costs at most a few thousand steps.
"""

from __future__ import annotations

import re

# Engine prefixes in front of a dump line, stripped one after the other (bounded).
PREFIXES: tuple[re.Pattern[str], ...] = (
    # vLLM `_add_prefix` (vllm/utils/system_utils.py): `(Worker_TP1 pid=7) `
    re.compile(r"^\((?P<proc>[A-Za-z][\w.:-]*) pid=(?P<pid>\d+)\) ?"),
    # SGLang `configure_logger` (srt/utils/common.py): `[2025-01-01 12:00:00 TP0] `
    re.compile(r"^\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?P<rank>(?: [A-Z]{2}\d+)*)\] ?"),
    # vLLM's own logger: `ERROR 01-12 02:58:31 [multiproc_executor.py:654] `; V0 wrote
    # `ERROR 10-30 11:47:32 async_llm_engine.py:56] ` (vllm/logger.py _FORMAT, before brackets)
    re.compile(
        r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d{2}-\d{2} [\d:.]+ (?:\[[^\]]*\]|[\w.-]+:\d+\]) ?"
    ),
    # Python logging default: `2025-06-08 21:06:35,733 - ERROR - ` (optionally a logger name)
    re.compile(r"^\d{4}-\d{2}-\d{2} [\d:,.]+ - (?:[\w.]+ - )?[A-Z]+ - "),
    # torch.distributed rank prefix: `[rank0]: `
    re.compile(r"^\[rank(?P<trank>\d+)\]:? ?"),
    # a dump quoted from a GitHub comment (Markdown blockquote): `> Thread 220 (active): ...`
    re.compile(r"^> ?"),
)

PYSPY_PROCESS = re.compile(r"^\s*Process (?P<pid>\d+): (?P<title>.*)$")
PYSPY_PYTHON = re.compile(r"^\s*Python v\d+\.\d+")
PYSPY_THREAD = re.compile(
    r"^\s*Thread (?:(?P<tid>0x[0-9A-Fa-f]+|\d+) )?\((?P<state>[a-z+]+)\): \"(?P<name>[^\"]*)\""
)
PYSPY_FRAME = re.compile(r"^\s{2,}(?P<name>[^\s()][^()]{0,300}?) \((?P<where>[^()]{1,400})\)$")
PYSPY_WHERE = re.compile(r"^(?P<file>.*?):(?P<line>\d+)$")
PYSPY_LOCALS = re.compile(r"^\s{2,}(?:Arguments|Locals):$|^\s{6,}\S")
SGLANG_DUMP = re.compile(r"Pyspy dump for PID (?P<pid>\d+):")

FH_THREAD = re.compile(
    r"^(?:(?P<current>Current thread)|Thread) (?P<tid>0x[0-9a-fA-F]+) \(most recent call first\):"
    r"|^(?P<stack>Stack) \(most recent call first\):"
)
FH_FRAME = re.compile(
    r'^\s+File "(?P<file>[^"]{1,400})", line (?P<line>\d+) in (?P<name>\S{1,300})'
)

GDB_THREAD = re.compile(
    r"^Thread (?P<n>\d+) \(Thread (?P<tid>0x[0-9a-f]+)(?: \(LWP (?P<lwp>\d+)\))?"
)
GDB_FRAME = re.compile(
    r"^#(?P<n>\d+)\s+(?:0x[0-9a-f]+ in )?(?P<name>internal driver call|\?\?|[^\s(]{1,300})"
    # a demangled C++ name carries its signature, then gdb's argument list: `f(void*) ()`
    r"(?:\((?P<sig>[^)]{0,400})\))?(?: \((?P<args>[^)]{0,400})\)?)?"
    r"(?: at (?P<file>\S+?):(?P<line>\d+)| from (?P<lib>\S+))?"
)

TB_START = re.compile(r"^Traceback \(most recent call last\):")
TB_FRAME = re.compile(
    r'^\s+File "(?P<file>[^"]{1,400})", line (?P<line>\d+), in (?P<name>\S{1,300})'
)
TB_END = re.compile(
    r"^(?P<exc>[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning|Dead\w*))(?::|$)"
)


# PREFIXES as one anchored alternation (their group names are distinct): `match` tries the
# alternatives in order, so the prefix found is the one trying each pattern in turn finds, with
# one regex call per prefix instead of up to six.
_ANY_PREFIX = re.compile("|".join(f"(?:{p.pattern})" for p in PREFIXES))


def strip_prefixes(line: str) -> tuple[str, str, int | None]:
    """The message without engine prefixes, the stream key they name, and a pid if any."""
    key, pid = "", None
    for _ in range(6):
        m = _ANY_PREFIX.match(line)
        if m is None:
            break
        proc_pid, rank, trank = m.group("pid", "rank", "trank")
        if proc_pid:
            pid = int(proc_pid)
            key = f"{m.group('proc')} pid={pid}"
        elif (rank or "").strip():
            key = key or rank.strip()
        elif trank:
            key = key or f"rank{trank}"
        line = line[m.end() :]
    return line, key, pid
