"""The `command` restarter with a real operator script: placeholders, the fallback's environment,
the fallback file written first, and a placeholder that cannot be filled refused at startup."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.fakes import SIGS, hang, remedy_config
from watchdog.config import ConfigError
from watchdog.outputs.sdnotify import child_environ
from watchdog.remediation.plan import make_plan
from watchdog.remediation.restarters import RestartError, make_restarter

ROOT = Path(__file__).resolve().parent.parent
FLAG = "--attention-config.use_trtllm_attention=0"


def operator_script(tmp_path: Path) -> tuple[Path, Path]:
    """A restart script that records its argv, the fallback variable and the file it was given."""
    script, record = tmp_path / "restart-vllm", tmp_path / "calls.jsonl"
    script.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        "env_file = sys.argv[-1].split('=', 1)[1]\n"
        f"with open({str(record)!r}, 'a') as fh:\n"
        "    fh.write(json.dumps({'argv': sys.argv[1:],\n"
        "        'env': os.environ.get('VLLM_USE_TRTLLM_ATTENTION'),\n"
        "        'file': open(env_file).read()}) + '\\n')\n"
        "sys.exit(int(os.environ.get('RESTART_EXIT', '0')))\n"
    )
    script.chmod(0o755)
    return script, record


def test_command_restarter_expands_the_placeholders(tmp_path: Path) -> None:
    script, record = operator_script(tmp_path)
    env_file = tmp_path / "fallback.env"
    cfg = remedy_config({"restarter": "command", "fallback_file": str(env_file),
                        "restart_command": [str(script), "{signature}", "{fallback}", "{args}",
                                            "flags={args}", "--env-file={env_file}"]})  # fmt: skip
    restarter = make_restarter(cfg, None, child_environ)
    new = make_plan(hang(), SIGS, {"vllm": "0.14.0"}, {})
    old = make_plan(hang(), SIGS, {"vllm": "0.10.2"}, {})
    assert new is not None and old is not None
    assert restarter.restart(new, None).startswith(f"ran {script} trtllm_attention_deadlock")
    restarter.restart(old, None)
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    sig, fallback = "trtllm_attention_deadlock", "disable_trtllm_attention"
    assert calls[0]["argv"] == [sig, fallback, FLAG, f"flags={FLAG}", f"--env-file={env_file}"]
    assert calls[0]["env"] is None and f'HANG_WATCHDOG_FALLBACK_ARGS="{FLAG}"' in calls[0]["file"]
    # older vLLM: no flag, so "{args}" alone becomes no argument at all; the variable is set
    assert calls[1]["argv"] == [sig, fallback, "flags=", f"--env-file={env_file}"]
    assert calls[1]["env"] == "0" and "VLLM_USE_TRTLLM_ATTENTION=0" in calls[1]["file"]


def test_command_restarter_failure_names_the_exit_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script, _ = operator_script(tmp_path)
    cfg = remedy_config({"restarter": "command", "fallback_file": str(tmp_path / "f.env"),
                        "restart_command": [str(script), "--env-file={env_file}"]})  # fmt: skip
    plan = make_plan(hang(), SIGS, {"vllm": "0.14.0"}, {})
    assert plan is not None
    monkeypatch.setenv("RESTART_EXIT", "3")
    with pytest.raises(RestartError, match="exited 3"):
        make_restarter(cfg, None, child_environ).restart(plan, None)


def test_an_unset_env_file_placeholder_is_a_config_error(tmp_path: Path) -> None:
    argv = ["/usr/local/bin/restart-vllm", "{env_file}"]
    cfg = remedy_config({"restarter": "command", "restart_command": argv})
    with pytest.raises(
        ConfigError, match=r"key 'restart_command': uses \{env_file\}.*fallback_file"
    ):
        make_restarter(cfg, None, child_environ)


def test_the_example_fallback_path_is_the_shipped_one() -> None:
    cfg = remedy_config({"restarter": "systemd", "systemd_unit": "vllm.service"})
    with pytest.raises(ConfigError) as err:
        make_restarter(cfg, None, child_environ)
    shipped = "/var/lib/hang-watchdog/fallback.env"
    assert shipped in str(err.value)
    assert f'fallback_file = "{shipped}"' in (ROOT / "systemd" / "config.toml").read_text()
