"""Check results and how they are shown: a readable table for people, a stable JSON for machines.

The JSON schema (`SCHEMA`) is a contract: CI jobs and initContainers parse it. Add fields, never
rename or remove them.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

SCHEMA = "hang-watchdog/preflight/v1"
STATUSES: tuple[str, ...] = ("PASS", "WARN", "FAIL", "SKIP")


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome: a status, a one-line reason, and the exact fixes when not PASS."""

    id: str
    status: str
    reason: str
    fixes: tuple[str, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"check {self.id}: status {self.status!r} is not one of {STATUSES}")


def passed(check_id: str, reason: str, **details: Any) -> CheckResult:
    """A PASS result."""
    return CheckResult(check_id, "PASS", reason, (), details)


def warned(check_id: str, reason: str, fixes: Sequence[str], **details: Any) -> CheckResult:
    """A WARN result with its fixes."""
    return CheckResult(check_id, "WARN", reason, tuple(fixes), details)


def failed(check_id: str, reason: str, fixes: Sequence[str], **details: Any) -> CheckResult:
    """A FAIL result with its fixes."""
    return CheckResult(check_id, "FAIL", reason, tuple(fixes), details)


def skipped(check_id: str, reason: str, **details: Any) -> CheckResult:
    """A SKIP result: the check does not apply here or could not run."""
    return CheckResult(check_id, "SKIP", reason, (), details)


def exit_code(results: Sequence[CheckResult], *, strict: bool = False) -> int:
    """0 when nothing failed, 1 when a check failed (or warned, with `strict`)."""
    bad = {"FAIL", "WARN"} if strict else {"FAIL"}
    return 1 if any(r.status in bad for r in results) else 0


def summary(results: Sequence[CheckResult]) -> dict[str, int]:
    """Count of results per status, every status present."""
    return {s.lower(): sum(1 for r in results if r.status == s) for s in STATUSES}


def to_json(results: Sequence[CheckResult], *, strict: bool, elapsed_s: float) -> str:
    """The `--json` document."""
    code = exit_code(results, strict=strict)
    doc = {
        "schema": SCHEMA,
        "ok": code == 0,
        "exit_code": code,
        "strict": strict,
        "elapsed_s": round(elapsed_s, 3),
        "summary": summary(results),
        "checks": [
            {
                "id": r.id,
                "status": r.status,
                "reason": r.reason,
                "fixes": list(r.fixes),
                "details": r.details,
            }
            for r in results
        ],
    }
    return json.dumps(doc, indent=2, default=str)


def render_table(results: Sequence[CheckResult], *, strict: bool, width: int = 100) -> str:
    """The human table: status, check id, reason; each fix indented under its check."""
    id_w = max([len(r.id) for r in results] + [5])
    lines = [f"{'STATUS':<6}  {'CHECK':<{id_w}}  REASON", f"{'-' * 6}  {'-' * id_w}  {'-' * 6}"]
    indent = " " * (6 + 2 + id_w + 2)
    for r in results:
        reason = textwrap.wrap(r.reason, max(width - len(indent), 30)) or [""]
        lines.append(f"{r.status:<6}  {r.id:<{id_w}}  {reason[0]}")
        lines.extend(indent + more for more in reason[1:])
        for fix in r.fixes:
            lines.append(f"{indent}fix: {fix}")
    counts = summary(results)
    code = exit_code(results, strict=strict)
    verdict = "OK" if code == 0 else "FAILED"
    lines.append("")
    lines.append(
        f"preflight {verdict}: {counts['pass']} passed, "
        f"{_plural(counts['warn'], 'warning')}, "
        f"{counts['fail']} failed, {counts['skip']} skipped" + (" (strict)" if strict else "")
    )
    return "\n".join(lines)


def _plural(n: int, word: str) -> str:
    """`1 warning`, `2 warnings`."""
    return f"{n} {word}" + ("" if n == 1 else "s")
