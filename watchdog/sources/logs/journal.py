"""Log lines of a systemd unit, read by following `journalctl -f -u UNIT` as a child process.

For servers run as `vllm.service`, whose stdout/stderr go to the journal rather than a file.
journalctl is started with an argv (never a shell), read through StreamReader so that no line is
lost between ticks, handed over as blocks of bytes like every other reader, and restarted
(rate-limited) if it exits. The default JSON output carries each entry's `__CURSOR`, so a
restarted journalctl resumes right after the last entry read (`--after-cursor`) and loses
nothing; `-o cat` has no cursor and can only resume "now".
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from typing import Any

from watchdog.sources.logs.split import Block
from watchdog.sources.logs.stream import StreamReader

OUTPUTS = ("cat", "json")


class JournalReader:
    """A block reader over `journalctl -f -o json|cat -u UNIT --since now`, resumed on restart."""

    def __init__(
        self,
        unit: str,
        *,
        journalctl: str = "journalctl",
        output: str = "json",
        runner: Callable[..., Any] = subprocess.Popen,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        restart_interval_s: float = 5.0,
    ) -> None:
        if not unit or unit.startswith("-"):
            raise ValueError(f"journal unit must be a unit name like 'vllm.service', got {unit!r}")
        if output not in OUTPUTS:
            raise ValueError(f"journal output must be one of {OUTPUTS}, got {output!r}")
        self.unit = unit
        self.name = f"journal:{unit}"
        self.error: str | None = None
        self.restarts = 0
        self.bad_records = 0  # JSON records that could not be decoded
        self._journalctl = journalctl
        self._output = output
        self._runner = runner
        self._clock = clock
        self._wall = wall
        self._restart_interval = restart_interval_s
        self._proc: Any = None
        self._out: StreamReader | None = None
        self._err: StreamReader | None = None
        self._next_start = float("-inf")
        self._cursor: str | None = None  # json mode: resume after the last entry seen
        self._first_start: int | None = None  # wall-clock second journalctl was first started

    def argv(self) -> list[str]:
        """The journalctl command line; a restart in json mode resumes where reading stopped.

        After an entry was read that is `--after-cursor`; before any, `--since @SECONDS` of the
        first start (systemd.time(7) timestamps), so entries written while it was down count.
        """
        if self._cursor is not None:
            resume = [f"--after-cursor={self._cursor}"]
        elif self._output == "json" and self._first_start is not None:
            resume = ["--since", f"@{self._first_start}"]
        else:
            resume = ["--since", "now"]
        return [self._journalctl, "-f", "-o", self._output, "-u", self.unit, *resume]

    def read_blocks(self) -> list[Block]:
        """The unit's new log lines as blocks; starts or restarts journalctl as needed. Never
        raises. `-o cat` output is the log itself; `-o json` records become their MESSAGEs."""
        if self._proc is None and self._clock() >= self._next_start:
            self._start()
        if self._out is None:
            return []
        blocks = self._decode(self._out.read_blocks())
        if self._out.eof and self._proc.poll() is not None:
            blocks += self._decode(self._out.read_blocks())
            self._exited(self._proc.returncode)
        return blocks

    def read(self) -> list[str]:
        """The unit's new log lines, one string each (tests and line-API callers)."""
        return [line for block in self.read_blocks() for line in block.lines()]

    def close(self) -> None:
        """Stop journalctl."""
        proc, self._proc, self._out = self._proc, None, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def _start(self) -> None:
        self._next_start = self._clock() + self._restart_interval
        argv = self.argv()
        if self._first_start is None:
            self._first_start = int(self._wall())
        try:
            self._proc = self._runner(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        except FileNotFoundError:
            self.error = (
                f"{self._journalctl!r} not found: install systemd's journalctl, put it on PATH, "
                "or read the server's log with --log-file instead of --journal-unit"
            )
            return
        except OSError as exc:
            self.error = f"cannot run {self._journalctl!r}: {exc}"
            return
        self._out = StreamReader(self._proc.stdout, self.name)
        self._err = StreamReader(self._proc.stderr, f"{self.name}:stderr", max_lines=50)
        self.error = None

    def _exited(self, code: int) -> None:
        detail = ""
        if self._err is not None:
            self._err.wait(timeout=1.0)
            stderr = [line.strip() for line in self._err.read() if line.strip()]
            detail = f": {stderr[-1]}" if stderr else ""
        self.error = f"journalctl for unit {self.unit} exited with code {code}{detail}; restarting"
        self.restarts += 1
        self._proc, self._out, self._err = None, None, None

    def _decode(self, blocks: list[Block]) -> list[Block]:
        if self._output == "cat":
            return blocks
        # One MESSAGE can hold many lines (SGLang logs a whole py-spy dump as one record).
        lines: list[str] = []
        for block in blocks:
            for record in block.lines():
                message = self._message(record)
                if message is not None:
                    lines.extend(message.splitlines())
        if not lines:
            return []
        data = "\n".join(lines).encode("utf-8", errors="replace") + b"\n"
        return [Block(data.replace(b"\x00", b"") if b"\x00" in data else data)]

    def _message(self, record: str) -> str | None:
        """MESSAGE of one `journalctl -o json` record.

        journald's JSON format (systemd.io JOURNAL_EXPORT_FORMATS) gives MESSAGE as a string,
        as an array of byte values when it is not valid UTF-8 or has control characters, or
        null when too large; ANSI colour in vLLM's output is one such control character.
        """
        try:
            entry = json.loads(record)
        except json.JSONDecodeError:
            self.bad_records += 1
            return None
        if not isinstance(entry, dict):
            self.bad_records += 1
            return None
        cursor = entry.get("__CURSOR")
        if isinstance(cursor, str):
            self._cursor = cursor
        message = entry.get("MESSAGE")
        if isinstance(message, str):
            return message
        if isinstance(message, list) and all(isinstance(b, int) and 0 <= b < 256 for b in message):
            return bytes(message).decode("utf-8", errors="replace")
        return None
