"""vLLM-shaped output for the simulator: the `(Proc pid=N) LEVEL MM-DD HH:MM:SS [file:line]` prefix
and tqdm bars rendered exactly as tqdm 4.x draws them (tqdm/std.py format_meter), teed to an
optional log file."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TextIO

# tqdm's unicode bar characters (tqdm.std.Bar.UTF), used when no ascii bar is requested.
_BAR_CHARS = " " + "".join(chr(0x258F - i) for i in range(8))
_BAR_WIDTH = 10  # tqdm's bar width when the terminal width is unknown (as in g_vllm16050).


def format_interval(seconds: float) -> str:
    """tqdm.format_interval: `MM:SS`, or `H:MM:SS` past an hour."""
    mins, secs = divmod(int(seconds), 60)
    hours, mins = divmod(mins, 60)
    if hours:
        return f"{hours:d}:{mins:02d}:{secs:02d}"
    return f"{mins:02d}:{secs:02d}"


def format_rate(n: int, elapsed: float) -> str:
    """tqdm's rate_fmt: `12.34it/s`, or `1.29s/it` when slower than one per second."""
    rate = n / elapsed if elapsed and n else None
    if rate is None:
        return "?it/s"
    if rate < 1:
        return f"{1 / rate:5.2f}s/it"
    return f"{rate:5.2f}it/s"


def format_bar(n: int, total: int) -> str:
    """The 10-cell unicode bar tqdm draws for n/total (checked against g_vllm16050)."""
    frac = n / total if total else 0.0
    nsyms = len(_BAR_CHARS) - 1
    full, part = divmod(int(frac * _BAR_WIDTH * nsyms), nsyms)
    bar = _BAR_CHARS[-1] * full
    if full < _BAR_WIDTH:
        bar += _BAR_CHARS[part] + " " * (_BAR_WIDTH - full - 1)
    return bar


def format_meter(n: int, total: int, elapsed: float, desc: str, postfix: str = "") -> str:
    """tqdm's default line: `desc:  NN%|bar| n/total [elapsed<remaining, rate, postfix]`."""
    pct = 100.0 * n / total if total else 0.0
    rate = n / elapsed if elapsed and n else None
    remaining = format_interval((total - n) / rate) if rate else "?"
    tail = f", {postfix}" if postfix else ""
    return (
        f"{desc}: {pct:3.0f}%|{format_bar(n, total)}| {n}/{total} "
        f"[{format_interval(elapsed)}<{remaining}, {format_rate(n, elapsed)}{tail}]"
    )


def format_loading(n: int, total: int, elapsed: float) -> str:
    """vLLM weight_utils _BAR_FORMAT: `{desc}: {percentage:3.0f}% Completed | n/total [...]`."""
    pct = 100.0 * n / total if total else 0.0
    rate = n / elapsed if elapsed and n else None
    remaining = format_interval((total - n) / rate) if rate else "?"
    return (
        f"Loading safetensors checkpoint shards: {pct:3.0f}% Completed | {n}/{total} "
        f"[{format_interval(elapsed)}<{remaining}, {format_rate(n, elapsed)}]"
    )


class Console:
    """stdout/stderr of one simulated process, each write also appended to the log file."""

    def __init__(
        self,
        out: TextIO,
        err: TextIO,
        log_path: str | None = None,
        clock: Callable[[], float] = time.time,
        engine: str = "vllm",
    ) -> None:
        self.engine = engine
        self.ranks = ""  # SGLang's log prefix of this process, e.g. " TP1" (TP>1 schedulers)
        self._out = out
        self._err = err
        self._log_path = log_path
        self._clock = clock
        self._lock = threading.Lock()

    def write(self, text: str, stream: str = "out") -> None:
        """Write raw text (tqdm redraws carry their own `\\r`) and flush at once."""
        target = self._err if stream == "err" else self._out
        with self._lock:
            target.write(text)
            target.flush()
            if self._log_path:
                with open(self._log_path, "a", encoding="utf-8") as fh:
                    fh.write(text)

    def line(self, text: str, stream: str = "out") -> None:
        """Write one complete line."""
        self.write(text + "\n", stream)

    def vllm(self, proc: str | None, pid: int, level: str, where: str, msg: str) -> None:
        """vLLM's prefixed line: `(APIServer pid=N) INFO MM-DD HH:MM:SS [loggers.py:123] msg`.

        Prefix from `decorate_logs()` in vllm/utils/system_utils.py; vLLM's default handler
        writes to stdout. `proc=None` gives the unprefixed form of the offline CLI process.
        """
        if self.engine == "sglang":
            self.sglang(msg)
            return
        if self.engine == "trtllm":
            self.trtllm(level, msg)
            return
        stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(self._clock()))
        prefix = f"({proc} pid={pid}) " if proc else ""
        self.line(f"{prefix}{level} {stamp} [{where}] {msg}")

    def sglang(self, msg: str, ranks: str | None = None) -> None:
        """SGLang's line: `[%Y-%m-%d %H:%M:%S{ranks}] msg` (srt/utils/common.py configure_logger;
        the rank prefix, e.g. ` TP0`, only when a parallel size is > 1)."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self._clock()))
        self.line(f"[{stamp}{self.ranks if ranks is None else ranks}] {msg}")

    def trtllm(self, level: str, msg: str) -> None:
        """TensorRT-LLM's line: `[%m/%d/%Y-%H:%M:%S] [TRT-LLM] [I] msg` (tensorrt_llm/logger.py
        Logger.log under logging.basicConfig; the root handler writes to stderr)."""
        from watchdog.sim.trtllm import log_line

        self.line(log_line(level, msg, self._clock), "err")


class Bar:
    """A tqdm bar redrawn in place: each draw is `\\r` + text + padding to the last length."""

    def __init__(self, console: Console, stream: str = "err") -> None:
        self._console = console
        self._stream = stream
        self._last_len = 0
        self.last = ""

    def draw(self, text: str) -> None:
        """Redraw like tqdm's status_printer (pads over a longer previous line)."""
        pad = " " * max(self._last_len - len(text), 0)
        self._last_len = len(text)
        self.last = text
        self._console.write("\r" + text + pad, self._stream)

    def close(self) -> None:
        """tqdm(leave=True).close() ends the bar with a newline."""
        self._console.write("\n", self._stream)
