"""`--help` text shared by the subcommands: exit codes, examples, and the config-key flags.

Every config key (watchdog/configkeys.py) is a flag of `run`; `diagnose` takes the keys that
matter for one sample. Help shows each default once, lists choices, marks repeatable flags,
and names values in words an operator knows (FILE, SECONDS, HOST:PORT), not key names.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from watchdog.config import ALIASES, Config

# The one exit-code rule of every command (README "Exit codes").
EXIT_CODES = (
    "exit codes:\n"
    "  0  ok: the server is not hung (or every check passed)\n"
    "  1  hung, stalled or dead (or a check failed)\n"
    "  2  usage, configuration or input error"
)
SUPERVISE_EXIT = "\n  N  with `-- COMMAND`: the command's own exit code once it ends by itself"

# Config keys whose flag name differs from the key, and keys with no flag of their own.
FLAG_NAMES = {
    "log_files": "--log-file",
    "cdn_hosts": "--cdn-host",
    "signatures": "--signatures",
    "engines": "--engines",
}
NO_FLAG = {"command", "fallback_overrides", "restart_command"}

# The remediation group's keys: a long-running `run` uses them, `diagnose` does not.
REMEDIATION_KEYS = (
    "state_dir",
    "remediate",
    "dry_run",
    "restarter",
    "fallback_file",
    "remediate_min_confidence",
    "cooldown_s",
    "max_restarts",
    "restart_window_s",
    "recover_within_s",
    "smoke_test",
    "canary",
    "canary_idle_s",
    "canary_timeout_s",
)

# --help groups, in order; a key in none of them lands in the last group.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("what to watch", ("pid", "match", "systemd_unit")),
    (
        "sources",
        (
            "log_files",
            "journal_unit",
            "server_url",
            "gpu_source",
            "gpus",
            "cdn_hosts",
            "cdn_default",
            "signatures",
        ),
    ),
    (
        "stack capture (py-spy)",
        (
            "stacks",
            "pyspy",
            "stack_native",
            "stack_locals",
            "stack_deadline_s",
            "stack_second_after_s",
        ),
    ),
    (
        "outputs",
        (
            "log_format",
            "metrics_addr",
            "metrics_stale_s",
            "incident_dir",
            "max_incidents",
            "max_incident_bytes",
        ),
    ),
    (
        "remediation (off unless --remediate)",
        REMEDIATION_KEYS,
    ),
    ("timing and thresholds", ()),
)

# Keys that only a long-running `run` uses: remediation, the idle canary, the exporter.
DAEMON_ONLY = frozenset({"metrics_addr", "metrics_stale_s", *REMEDIATION_KEYS})

# Value names a user knows, by key; the rest are derived from the key's type and name.
METAVARS = {
    "pid": "PID",
    "match": "REGEX",
    "systemd_unit": "UNIT",
    "journal_unit": "UNIT",
    "log_files": "FILE",
    "server_url": "URL",
    "fleet_prometheus_url": "URL",
    "gpu_source": "SOURCE",
    "gpus": "GPU",
    "cdn_hosts": "HOST[:PORT]",
    "signatures": "FILE",
    "metrics_addr": "HOST:PORT",
    "incident_dir": "DIR",
    "state_dir": "DIR",
    "pyspy": "PATH",
    "fallback_file": "FILE",
    "max_incidents": "N",
    "max_incident_bytes": "BYTES",
    "max_restarts": "N",
    "deployment": "NAME",
    "node": "NAME",
    "nccl_ras_addr": "HOST:PORT",
}


def flag_name(key: str) -> str:
    """The command-line flag of a config key."""
    return FLAG_NAMES.get(key, "--" + key.replace("_", "-"))


def metavar(f: dataclasses.Field[Any]) -> str:
    """The value's name in --help: a word for what to type, not the key's name."""
    if f.name in METAVARS:
        return METAVARS[f.name]
    kind = str(f.type)
    if "float" in kind:
        return "SECONDS" if f.name.endswith("_s") else "RATIO"
    return "N" if "int" in kind else "VALUE"


def default_of(f: dataclasses.Field[Any]) -> Any:
    """A field's default value (its factory called for lists and dicts)."""
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def help_text(f: dataclasses.Field[Any]) -> str:
    """The key's help, with the default shown once and repeatable flags marked."""
    text = str(f.metadata["help"])
    kind = str(f.type)
    if "list" in kind:
        text += "; repeatable"
    default = default_of(f)
    if "default" in text.lower() or default in (None, [], ""):
        return text
    if isinstance(default, bool):
        return f"{text} (default: {'on' if default else 'off'})"
    return (
        f"{text} (default: {default:g})"
        if isinstance(default, float)
        else f"{text} (default: {default})"
    )


def add_config_flags(p: argparse.ArgumentParser, *, daemon: bool) -> None:
    """One flag per config key, grouped for --help; `daemon=False` leaves out `run`-only keys."""
    fields = {f.name: f for f in dataclasses.fields(Config) if f.name not in NO_FLAG}
    if not daemon:
        fields = {k: f for k, f in fields.items() if k not in DAEMON_ONLY}
    p.add_argument(
        "--config", metavar="FILE", help="TOML config file (every key has a default; flags win)"
    )
    placed: set[str] = set()
    for title, keys in GROUPS:
        rest = [k for k in fields if k not in placed] if not keys else list(keys)
        chosen = [fields[k] for k in rest if k in fields and k not in placed]
        if not chosen:
            continue
        group = p.add_argument_group(title)
        for f in chosen:
            placed.add(f.name)
            _add_flag(group, f)
            _add_aliases(group, f)


def _add_flag(group: Any, f: dataclasses.Field[Any]) -> None:
    kind = str(f.type)
    common: dict[str, Any] = {"dest": f.name, "default": None, "help": help_text(f)}
    if "bool" in kind:
        group.add_argument(flag_name(f.name), action=argparse.BooleanOptionalAction, **common)
        return
    choices = tuple(f.metadata.get("choices") or ())
    if choices:
        group.add_argument(flag_name(f.name), choices=choices, **common)
    elif "list" in kind:
        group.add_argument(flag_name(f.name), action="append", metavar=metavar(f), **common)
    else:
        tp = int if "int" in kind and "float" not in kind else float if "float" in kind else str
        group.add_argument(flag_name(f.name), type=tp, metavar=metavar(f), **common)


def _add_aliases(group: Any, f: dataclasses.Field[Any]) -> None:
    """The key's old flag names (config.ALIASES), read as the new one for one release."""
    for old in (o for o, new in ALIASES.items() if new == f.name):
        group.add_argument(
            flag_name(old),
            dest=old,
            default=None,
            metavar=metavar(f),
            help=f"old name of {flag_name(f.name)}, kept for one release",
        )


def epilog(examples: list[tuple[str, str]], *, supervise: bool = False) -> str:
    """Examples then the exit codes, for a RawDescriptionHelpFormatter parser."""
    lines = ["examples:"]
    for comment, command in examples:
        lines += [f"  # {comment}", f"  {command}"]
    return "\n".join(lines) + "\n\n" + EXIT_CODES + (SUPERVISE_EXIT if supervise else "")
