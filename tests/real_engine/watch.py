"""The watchdog as a real process beside a real vLLM: started, read, stopped."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.real_engine.engine import REPO, http, stop_group

Event = dict[str, Any]


@dataclass
class Watchdog:
    """`python -m watchdog run ...` with JSON events on stderr, read as they come."""

    work: Path
    args: Sequence[str]
    name: str = "watchdog"
    env: Mapping[str, str] | None = None  # the whole environment (a supervised server's too)
    proc: subprocess.Popen[bytes] | None = None
    seen: dict[int, float] = field(default_factory=dict)  # event index -> wall time first read

    @property
    def err(self) -> Path:
        return self.work / f"{self.name}.stderr"

    @property
    def incidents(self) -> Path:
        return self.work / f"{self.name}-incidents"

    def start(self) -> Watchdog:
        self.work.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "watchdog", "run", "--log-format", "json"]
        argv += ["--no-cdn-default", "--metrics-addr", "127.0.0.1:0", "--incident-dir"]
        argv += [str(self.incidents), "--state-dir", str(self.work / f"{self.name}-state")]
        with open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                [*argv, *self.args],
                stdout=subprocess.DEVNULL,
                stderr=err,
                cwd=REPO,
                env=dict(self.env) if self.env is not None else None,
                start_new_session=True,
            )
        return self

    def events(self) -> list[Event]:
        """Every JSON event so far; each stamped with the wall time this test first read it."""
        out: list[Event] = []
        try:
            lines = self.err.read_text(errors="replace").splitlines()
        except OSError:
            return out
        for line in lines:
            if not line.startswith("{"):
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            i = len(out)
            ev["_read_at"] = self.seen.setdefault(i, time.time())
            out.append(ev)
        return out

    def states(self) -> list[Event]:
        return [e for e in self.events() if e.get("event") == "state"]

    def wait_event(self, match: Callable[[Event], bool], timeout: float, what: str) -> Event:
        """The first event that `match`es; polled every 0.2 s, so `_read_at` is within 0.2 s."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for ev in self.events():
                if match(ev):
                    return ev
            if self.proc is not None and self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"{self.name}: no {what} within {timeout:.0f} s:\n{self.summary()}")

    def wait_state(self, state: str, timeout: float, signature: str | None = None) -> Event:
        def match(ev: Event) -> bool:
            if ev.get("event") != "state" or ev.get("new") != state:
                return False
            return signature is None or (ev.get("verdict") or {}).get("signature") == signature

        return self.wait_event(match, timeout, f"state {state} {signature or ''}".strip())

    def alarms(self) -> list[Event]:
        """State events into a hang, stall or death: what a no-false-alarm scenario forbids."""
        return [e for e in self.states() if e.get("new") in ("stalled", "hung", "dead")]

    def metrics(self) -> str:
        port = None
        for ev in self.events():
            msg = str(ev.get("message", ""))
            if "metrics on http://127.0.0.1:" in msg:
                port = msg.split("metrics on http://127.0.0.1:")[1].split("/")[0]
        assert port, f"{self.name}: no metrics address in its log:\n{self.summary()}"
        return http(f"http://127.0.0.1:{port}/metrics")[1]

    def summary(self, n: int = 40) -> str:
        """The state lines and the last lines of stderr, for a failure message."""
        lines = []
        for ev in self.events():
            if ev.get("event") in ("state", "remediation", "incident") or "WARNING" in str(
                ev.get("level", "")
            ):
                lines.append(f"{ev.get('ts')} {ev.get('event')}: {ev.get('message')}")
        try:
            raw = self.err.read_text(errors="replace").splitlines()[-n:]
        except OSError:
            raw = []
        return "\n".join(lines[-n:]) + "\n--- stderr tail ---\n" + "\n".join(raw)

    def stop(self) -> None:
        stop_group(self.proc, grace_s=30)


def evidence_kinds(ev: Event) -> set[str]:
    """The evidence sources of a state event's verdict, e.g. {"stacks", "conns", "log"}."""
    return {str(e.get("source")) for e in (ev.get("verdict") or {}).get("evidence") or []}


def evidence_text(ev: Event) -> str:
    return "\n".join(
        f"[{e.get('source')}] {e.get('detail')}"
        for e in (ev.get("verdict") or {}).get("evidence") or []
    )
