"""Pre-flight checks: fail in seconds, before a multi-terabyte load, with the fix.

The `preflight` command itself is watchdog/commands/preflight.py.
"""
