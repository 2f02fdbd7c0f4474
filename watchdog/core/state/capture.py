"""The result of one stack capture: the stacks the classifier reads and the raw dumps the
incident bundle writes. Its own module so that outputs read it without importing the sources."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from watchdog.core.model import StackSample


@dataclass(frozen=True)
class CaptureResult:
    """The stacks of one capture, the raw dumps for the bundle, and an overall result."""

    samples: tuple[StackSample, ...]
    raw_text: dict[int, str]
    raw_json: dict[int, list[dict[str, Any]]]
    second_text: dict[int, str]
    result: str  # ok | partial | timeout | permission_denied | not_found | error
    reason: str
