"""`hang-watchdog fallback show|clear`: what remediation applied, and how an operator undoes it.

`clear` resets the restart counters and `remediation_exhausted`, forgets the active fallback and
empties the fallback file, so the next start of the server runs without it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

from watchdog.config import Config
from watchdog.remediation.restarters import RestartError, write_env_file
from watchdog.remediation.state import RemediationState, StateError, StateStore


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of the `fallback` subcommand."""
    p.add_argument("action", choices=("show", "clear"), help="show the state, or clear it")
    p.add_argument(
        "--state-dir",
        metavar="DIR",
        default=Config.state_dir,
        help=f"remediation state directory (default: {Config.state_dir})",
    )
    p.add_argument(
        "--fallback-file",
        metavar="FILE",
        help="EnvironmentFile the server reads (emptied by clear)",
    )
    p.add_argument(
        "--restarter",
        choices=("supervise", "systemd", "kubernetes", "command"),
        default=None,
        help="the restarter remediation used (with --restart: systemd)",
    )
    p.add_argument("--systemd-unit", metavar="UNIT", help="with --restart: the server's unit")
    p.add_argument(
        "--restart",
        action="store_true",
        help="after clear, `systemctl restart UNIT` now (restarter systemd)",
    )
    p.add_argument("--json", action="store_true", help="show: print the state as JSON")


def run(args: argparse.Namespace) -> int:
    """Exit 0 on success, 2 when the state or a flag is unusable."""
    store = StateStore(args.state_dir)
    try:
        state = store.load()
    except StateError as exc:
        if args.action == "show":
            print(f"hang-watchdog fallback: {exc}", file=sys.stderr)
            return 2
        state = RemediationState()  # clear repairs an unreadable file
    if args.action == "show":
        print(json.dumps(_doc(store, state), indent=2) if args.json else _text(store, state))
        return 0
    return _clear(args, store, state)


def _doc(store: StateStore, state: RemediationState) -> dict[str, Any]:
    return {
        "state_file": str(store.path),
        "fallback_file": state.fallback_file,
        "active": state.active,
        "exhausted": state.exhausted,
        "exhausted_reason": state.exhausted_reason,
        "restarts": state.restarts,
        "history": state.history,
    }


def _text(store: StateStore, state: RemediationState) -> str:
    active = state.active or {}
    lines = [f"state file: {store.path}"]
    if state.fallback_file:
        lines.append(f"fallback file: {state.fallback_file}")
    if active:
        lines.append(f"active fallback: {', '.join(active.get('fallbacks') or [])}")
        if active.get("args"):
            lines.append(f"  arguments: {' '.join(active['args'])}")
        for key, value in sorted((active.get("env") or {}).items()):
            lines.append(f"  environment: {key}={value}")
    else:
        lines.append("active fallback: none")
    lines.append(f"restarts recorded: {len(state.restarts)}")
    for t in state.restarts[-5:]:
        lines.append(f"  {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(t))}")
    if state.exhausted:
        lines.append(f"REMEDIATION EXHAUSTED: {state.exhausted_reason}")
    for entry in state.history[-5:]:
        lines.append(f"history: {entry.get('signature')} {entry.get('fallback')} -> "
                     f"{entry.get('outcome')}: {entry.get('reason', '')}")  # fmt: skip
    return "\n".join(lines)


def _clear(args: argparse.Namespace, store: StateStore, state: RemediationState) -> int:
    # The watchdog records the file it writes, so `clear` empties it without being told.
    env_file = args.fallback_file or state.fallback_file
    fresh = RemediationState(history=state.history, fallback_file=env_file)
    fresh.record({"cleared": True, "wall": time.time(), "was_active": state.active})
    try:
        store.save(fresh)
        print(f"cleared {store.path}: no active fallback, restart counters reset")
        if env_file:
            print(f"emptied {write_env_file(env_file, None)}")
    except (OSError, RestartError) as exc:
        print(f"hang-watchdog fallback: {exc}", file=sys.stderr)
        return 2
    if not env_file:
        print(
            f"no fallback file is recorded in {store.path}: a supervising watchdog (`run --`) "
            "starts the server without the fallback from its next restart, but a file the "
            "server reads (systemd, kubernetes, command) still holds it; empty it with "
            f"`hang-watchdog fallback clear --state-dir {store.dir} --fallback-file PATH`"
        )
    if not args.restart:
        if env_file:
            print("the server runs without the fallback from its next restart")
        return 0
    if args.restarter != "systemd" or not args.systemd_unit:
        print("hang-watchdog fallback: --restart needs --restarter systemd and --systemd-unit",
              file=sys.stderr)  # fmt: skip
        return 2
    argv = ["systemctl", "restart", args.systemd_unit]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"hang-watchdog fallback: {' '.join(argv)}: {exc}", file=sys.stderr)
        return 1
    print(f"ran {' '.join(argv)}: exit {done.returncode}")
    return 0 if done.returncode == 0 else 1
