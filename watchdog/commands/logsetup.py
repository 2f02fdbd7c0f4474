"""The watchdog's own log lines on stderr, in the Emitter's form and timestamp: text
(`2026-01-01T12:00:00Z hang-watchdog WARNING: ...`) or one JSON object per line."""

from __future__ import annotations

import json
import logging
import sys
import time

from watchdog.outputs.emit import STAMP


def setup_logging(fmt: str) -> None:
    """One stderr handler in `fmt` (text or json); a second call replaces the first's handler."""
    root = logging.getLogger("hang_watchdog")
    for old in [h for h in root.handlers if getattr(h, "hang_watchdog_cli", False)]:
        root.removeHandler(old)
    handler = logging.StreamHandler(sys.stderr)
    handler.hang_watchdog_cli = True  # type: ignore[attr-defined]
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(_TextFormatter())
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    root.propagate = False


class _TextFormatter(logging.Formatter):
    """`2026-01-01T12:00:00Z hang-watchdog WARNING: ...`: the Emitter's timestamp and form."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime(STAMP, time.gmtime(record.created))
        return f"{stamp} hang-watchdog {record.levelname}: {record.getMessage()}"


class _JsonFormatter(logging.Formatter):
    """Log records as JSON objects shaped like the Emitter's (`ts`, `event`, `message`)."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(
            {
                "ts": time.strftime(STAMP, time.gmtime(record.created)),
                "event": "log",
                "level": record.levelname,
                "message": record.getMessage(),
            }
        )
