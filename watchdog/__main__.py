"""`python -m watchdog` runs the same CLI as the `hang-watchdog` console script."""

from __future__ import annotations

import sys

from watchdog.commands.cli import main

if __name__ == "__main__":
    sys.exit(main())
