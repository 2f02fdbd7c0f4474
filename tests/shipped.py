"""The shipped knowledge, loaded once for the test modules that read it, as the daemon's
wiring loads it once and passes it down (watchdog/knowledge.py)."""

from __future__ import annotations

from watchdog.knowledge import load_knowledge
from watchdog.sources.logs.parse import LogPatterns

KNOWLEDGE = load_knowledge()
# The shipped engine profiles' log formats, as the wiring hands them to its log source.
PATTERNS = LogPatterns.from_engines(KNOWLEDGE.engines)
