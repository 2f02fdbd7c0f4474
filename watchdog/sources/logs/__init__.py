"""Log lines from files, pipes and the journal, into LogEvents: read, split, prefilter, parse.

The package's entry points: `LogSource` (the live source, polled once per tick over block
readers: `FileFollower` for tail -F, `StreamReader` for a pipe or stdin, `JournalReader` for a
systemd unit) and `scan_bytes` (a whole log already read, for `replay`). Every reader hands
over blocks of bytes, so there is one path from bytes to events.
"""

from __future__ import annotations

from watchdog.sources.logs.journal import JournalReader
from watchdog.sources.logs.parse import LogPatterns
from watchdog.sources.logs.source import BlockReader, FileFollower, LogSource
from watchdog.sources.logs.stream import StreamReader
from watchdog.sources.logs.wholelog import LogScan, log_records, scan_bytes

__all__ = [
    "BlockReader",
    "FileFollower",
    "JournalReader",
    "LogPatterns",
    "LogScan",
    "LogSource",
    "StreamReader",
    "log_records",
    "scan_bytes",
]
