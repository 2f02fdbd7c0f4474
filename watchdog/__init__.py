"""hang-watchdog: tells operators that an LLM inference server is hung, why, and what to do."""

__version__ = "0.1.0"
