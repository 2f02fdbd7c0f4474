"""Start the simulated trtllm-serve through a console script named `trtllm-serve`.

TensorRT-LLM's setup.py declares `trtllm-serve=tensorrt_llm.commands.serve:main` under
console_scripts, so pip writes a `#!/path/to/python` script named `trtllm-serve` and the API
server's command line reads `python .../bin/trtllm-serve serve MODEL --backend pytorch ...`.
The simulator writes the same kind of script (a `#!` line naming this interpreter) into a temp
dir and execs it once, so the watchdog recognises the engine from the command line by itself.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

MARKER = "WATCHDOG_SIM_TRTLLM_SERVE"  # set once re-executed, so it happens at most once
SCRIPT = "trtllm-serve"


def launcher_argv(model: str) -> list[str]:
    """What the real server's argv shows after the script: `serve MODEL --backend pytorch`."""
    return ["serve", model, "--backend", "pytorch"]


def script_text(sim_argv: Sequence[str], package_root: str, bindir: str) -> str:
    """The console script: this interpreter, the repo on sys.path, the simulator's own argv."""
    return (
        f"#!{sys.executable}\n"
        "# Simulated trtllm-serve console script (hang-watchdog's simulator).\n"
        "import shutil, sys\n"
        f"sys.path.insert(0, {package_root!r})\n"
        f"shutil.rmtree({bindir!r}, ignore_errors=True)  # read once at start; leave nothing\n"
        "from watchdog.sim.vllm_sim import main\n"
        f"sys.exit(main({list(sim_argv)!r}))\n"
    )


def reexec_as_trtllm_serve(sim_argv: Sequence[str], model: str, workdir: str | None) -> None:
    """Exec once through a `trtllm-serve` script; returns only when that already happened."""
    if os.environ.get(MARKER):
        return
    bindir = tempfile.mkdtemp(prefix="trtllm-bin-", dir=workdir)
    script = Path(bindir) / SCRIPT
    root = str(Path(__file__).resolve().parents[2])  # the directory holding `watchdog/`
    tmp = script.with_suffix(".tmp")
    tmp.write_text(script_text(sim_argv, root, bindir), encoding="utf-8")
    tmp.chmod(0o755)
    os.replace(tmp, script)
    env = dict(os.environ)
    env[MARKER] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(script, [str(script), *launcher_argv(model)], env)
    except OSError as e:  # e.g. a noexec temp dir: serve on, as `python -m watchdog.sim...`
        shutil.rmtree(bindir, ignore_errors=True)
        print(
            f"simulator: cannot exec {script} ({e}); the command line will not read "
            "trtllm-serve, so pass --engine trtllm to the watchdog",
            file=sys.stderr,
        )
