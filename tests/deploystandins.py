"""Stand-ins for what a deployment test cannot run here: the `sglang` executable and `systemctl`.

`write_sglang(bindir)` makes an `sglang` command that records the argv it received (one JSON
line in $SGLANG_STANDIN_ARGV_LOG) and then runs the SGLang simulator in its own process, so the
server's command line stays `.../sglang serve --model-path ...` as the shipped unit and
entrypoint start it. The simulator's own options come from $SGLANG_STANDIN_SIM_ARGS (JSON).

`write_systemctl(bindir)` makes a `systemctl` that knows one unit file ($SYSTEMCTL_STANDIN_UNIT):
`start`/`restart UNIT` run its ExecStart= the way systemd expands it (systemd.service(5),
"Command lines"), with its Environment= and EnvironmentFile= lines (absolute paths mapped
through $SYSTEMCTL_STANDIN_PATHS, JSON), and `show -p MainPID --value UNIT` prints the running
server's pid (0 when none). ExecStartPre= (the preflight) is not run: it needs the GPUs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

_KEY_VALUE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def sglang_main() -> int:
    """`sglang serve ARGS`: log ARGS, then be the SGLang simulator with them."""
    with open(os.environ["SGLANG_STANDIN_ARGV_LOG"], "a", encoding="utf-8") as fh:
        fh.write(json.dumps(sys.argv[1:]) + "\n")
    if sys.argv[1:2] != ["serve"]:
        print("sglang stand-in: only `sglang serve ...` is simulated", file=sys.stderr)
        return 2
    from watchdog.sim.vllm_sim import main

    return main([*json.loads(os.environ["SGLANG_STANDIN_SIM_ARGS"]), *sys.argv[2:]])


def systemd_expand(command: str, env: Mapping[str, str]) -> list[str]:
    """Split into words (quotes group), then `$VAR` alone becomes zero or more words split at
    whitespace and `${VAR}` inside a word is replaced verbatim (empty when unset)."""
    argv: list[str] = []
    for word in shlex.split(command):
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if whole:
            argv += env.get(whole[1], "").split()
            continue
        argv.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m[1], ""), word))
    return argv


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of an EnvironmentFile, one pair of surrounding quotes removed."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        m = _KEY_VALUE.match(line)
        if m:
            value = m[2]
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
                value = value[1:-1]
            out[m[1]] = value
    return out


class Unit:
    """One unit file and the stand-in's state directory (pid file, start log, output)."""

    def __init__(self, unit: Path, state: Path, paths: Mapping[str, str]) -> None:
        self.unit, self.state, self.paths = unit, state, paths
        self.pidfile = state / f"{unit.name}.pid"

    def entries(self, section: str = "Service") -> list[tuple[str, str]]:
        """(key, value) of every assignment in one section, in order."""
        out, current = [], ""
        for raw in self.unit.read_text().splitlines():
            line = raw.strip()
            if line.startswith("["):
                current = line.strip("[]")
            elif line and not line.startswith(("#", ";")) and current == section:
                key, _, value = line.partition("=")
                out.append((key.strip(), value.strip()))
        return out

    def environment(self) -> dict[str, str]:
        """Ours, then Environment= and EnvironmentFile= in order ("-" = optional)."""
        env = dict(os.environ)
        for key, value in self.entries():
            if key == "Environment":
                env.update(w.partition("=")[::2] for w in shlex.split(value))
            elif key == "EnvironmentFile":
                path = Path(self.paths.get(value.lstrip("-"), value.lstrip("-")))
                if path.exists():
                    env.update(read_env_file(path))
                elif not value.startswith("-"):
                    raise SystemExit(f"systemctl stand-in: {path} is missing")
        return env

    def main_pid(self) -> int:
        try:
            pid = int(self.pidfile.read_text())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return 0
        return pid

    def start(self) -> None:
        env = self.environment()
        (command,) = [v for k, v in self.entries() if k == "ExecStart"]
        argv = systemd_expand(command, env)
        argv[0] = self.paths.get(argv[0], argv[0])
        with open(self.state / f"{self.unit.name}.log", "ab") as log:
            proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log, start_new_session=True)
        self.pidfile.write_text(str(proc.pid))
        with open(self.state / "starts.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(argv) + "\n")

    def stop(self) -> None:
        """KillMode=control-group: the whole process group, SIGKILL after 20 s."""
        pid = self.main_pid()
        if not pid:
            return
        os.killpg(pid, signal.SIGTERM)
        end = time.monotonic() + 20
        while self.main_pid() and time.monotonic() < end:
            time.sleep(0.1)
        if self.main_pid():
            os.killpg(pid, signal.SIGKILL)


def systemctl_main() -> int:
    """`systemctl start|stop|restart|show ... UNIT` for the one unit."""
    unit = Unit(
        Path(os.environ["SYSTEMCTL_STANDIN_UNIT"]),
        Path(os.environ["SYSTEMCTL_STANDIN_DIR"]),
        json.loads(os.environ.get("SYSTEMCTL_STANDIN_PATHS", "{}")),
    )
    args = sys.argv[1:]
    if not args or args[-1] != unit.unit.name:
        print(f"systemctl stand-in knows only {unit.unit.name}: {args}", file=sys.stderr)
        return 1
    verb = args[0]
    if verb == "show":
        print(unit.main_pid())
    elif verb in ("stop", "restart"):
        unit.stop()
    if verb in ("start", "restart"):
        unit.start()
    return 0 if verb in ("show", "start", "stop", "restart") else 1


def _write(bindir: Path, name: str, func: str) -> Path:
    bindir.mkdir(parents=True, exist_ok=True)
    path = bindir / name
    path.write_text(
        f"#!{sys.executable}\nimport sys\nfrom tests.deploystandins import {func}\n"
        f"sys.exit({func}())\n"
    )
    path.chmod(0o755)
    return path


def write_sglang(bindir: Path) -> Path:
    """The `sglang` stand-in (records its argv, runs the SGLang simulator)."""
    return _write(bindir, "sglang", "sglang_main")


def write_systemctl(bindir: Path) -> Path:
    """The `systemctl` stand-in for one unit."""
    return _write(bindir, "systemctl", "systemctl_main")
