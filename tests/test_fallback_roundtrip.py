"""The fallback file the watchdog writes is the file the shipped vLLM entrypoint applies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from watchdog.remediation.plan import Plan
from watchdog.remediation.restarters import write_env_file

ROOT = Path(__file__).resolve().parent.parent
ENTRYPOINT = ROOT / "kubernetes" / "vllm-entrypoint.sh"
SHOW = "import json, os, sys; print(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ)}))"


def _apply(tmp_path: Path, plan: Plan | None) -> dict[str, object]:
    env_file = write_env_file(tmp_path / "shared" / "fallback.env", plan)
    env = {
        **os.environ,
        "HANG_WATCHDOG_FALLBACK_FILE": str(env_file),
        "HANG_WATCHDOG_LOG_FILE": "",
    }
    done = subprocess.run(
        ["bash", str(ENTRYPOINT), sys.executable, "-c", SHOW, "serve", "M"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_entrypoint_appends_the_trtllm_flag(tmp_path: Path) -> None:
    plan = Plan(
        signature="trtllm_attention_deadlock",
        fallback="disable_trtllm_attention",
        restart=True,
        args=("--attention-config.use_trtllm_attention=0",),
        active=("disable_trtllm_attention",),
    )
    seen = _apply(tmp_path, plan)
    assert seen["argv"] == ["serve", "M", "--attention-config.use_trtllm_attention=0"]


def test_the_entrypoint_exports_the_nvls_environment(tmp_path: Path) -> None:
    env = {"NCCL_NVLS_ENABLE": "0", "VLLM_ALLREDUCE_USE_SYMM_MEM": "0"}
    plan = Plan("nvls_multicast_failure", "disable_nvls", True, env=env, active=("disable_nvls",))
    seen = _apply(tmp_path, plan)
    assert seen["argv"] == ["serve", "M"]
    got = seen["env"]
    assert isinstance(got, dict)
    assert got["NCCL_NVLS_ENABLE"] == "0" and got["VLLM_ALLREDUCE_USE_SYMM_MEM"] == "0"


def test_a_cleared_fallback_changes_nothing(tmp_path: Path) -> None:
    seen = _apply(tmp_path, None)
    assert seen["argv"] == ["serve", "M"]
