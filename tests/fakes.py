"""Helpers shared by several test modules: stand-ins, builders and constants that used to be
imported from one test module into another (which ran that module's tests' imports too)."""

from __future__ import annotations

from watchdog.sources.pyenv import COMMON, PACKAGES

# What the daemon's wiring hands build_environment: the shipped profiles' own distributions.
ENGINE_PACKAGES = tuple(p for p in PACKAGES if p not in COMMON)
