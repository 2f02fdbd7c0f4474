"""The root cause under a live verdict (core/judge/rootcause.py), read from the same log lines
`replay` reads: the window's events from the server's last progress on."""

from __future__ import annotations

import dataclasses

from watchdog.core.judge.genericlive import live_events
from watchdog.core.judge.rootcause import cause_of
from watchdog.core.model import Evidence, Verdict
from watchdog.core.state.window import Window

_ALARMS = frozenset({"dead", "hung", "stalled"})


def with_cause(verdict: Verdict, window: Window) -> Verdict:
    """`verdict` with the root cause its log lines name, its evidence line right after the
    verdict's own decisive one; under a generic class (no signature) the cause's fix comes
    before the live evidence the class names."""
    if verdict.state not in _ALARMS:
        return verdict
    cause = cause_of(live_events(window))
    if cause is None:
        return verdict
    ev = Evidence("log", f"cause:{cause.kind}", f"{cause.text()}: {cause.line.strip()}", 0.5)
    return dataclasses.replace(
        verdict,
        evidence=verdict.evidence[:1] + (ev,) + verdict.evidence[1:],
        reason=f"{verdict.reason}; root cause: {cause.text()}",
        fix=verdict.fix if verdict.signature is not None else f"{cause.fix} {verdict.fix}".strip(),
    )
