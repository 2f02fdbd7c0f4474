"""benchmarks/gpu_live.py on a machine without a GPU: its expectations against recorded NVML
answers (tests/data/nvml/), its no-GPU exit, and a full rehearsal with the `file:` source.

The answers run through the real NvmlBackend (a pynvml stand-in passed as `module=`) and the
real classifier, so a change to either that would flip a live result fails here first.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.obsbuilder import SERVER_PID, SYNC_STACK, events, stack
from tests.simfixtures import REPO_ROOT, sim_env
from watchdog.core.judge.classify import Thresholds, classify
from watchdog.core.knowledge.signatures import load_signatures
from watchdog.core.model import Observation, ProcInfo, ProcSnapshot, to_dict
from watchdog.core.state.window import Window
from watchdog.sources.gpu.nvml import NvmlBackend

BENCH = REPO_ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import gpu_live_cases as cases  # noqa: E402
from gpu_live_child import stats_line  # noqa: E402
from nvml_answers import RecordingNvml, ReplayNvml  # noqa: E402

ANSWERS = REPO_ROOT / "tests" / "data" / "nvml"
SETS = ("h200", "nodram")
CASES = ("spin", "memcopy", "idle")


SPINS = ("spin", "spinfull", "latency")  # the workloads whose host waits in synchronize


def replayed(answer_set: str, case: str, answers: dict[str, Any] | None = None) -> NvmlBackend:
    path = ANSWERS / answer_set / f"{case}.json"
    module = ReplayNvml(answers, SERVER_PID) if answers else ReplayNvml.load(path, SERVER_PID)
    backend = NvmlBackend(module=module)
    backend.init()
    return backend


def verdict_for(
    answer_set: str, case: str, seconds: int = 40, answers: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What the watchdog concludes about the workload, one tick a second, as diagnose would."""
    backend = replayed(answer_set, case, answers)
    log = events([stats_line(0 if case == "idle" else 1)])  # the workload's own line, parsed
    window, sigs, th = Window(), load_signatures(), Thresholds()
    for t in range(seconds):
        me = ProcInfo(SERVER_PID, 1, "python3", "gpu_live_child.py", 5.0 + t, None, "running")
        window.append(
            Observation(
                t=1000.0 + t,
                wall=1.7e9 + t,
                gpus=(backend.sample(0),),
                logs=log if t % 2 == 0 else (),
                procs=ProcSnapshot(SERVER_PID, True, (me,)),
                stacks=(stack(*SYNC_STACK, pid=SERVER_PID),) if case in SPINS and t > 9 else (),
            )
        )
    backend.shutdown()
    return to_dict(classify(window, sigs, th))


@pytest.mark.parametrize("answer_set", SETS)
@pytest.mark.parametrize("case", CASES)
def test_recorded_answers_meet_the_scripts_expectation(answer_set: str, case: str) -> None:
    ok, why = cases.judge(case, verdict_for(answer_set, case))
    assert ok, why


@pytest.mark.parametrize("case", ["l2matmul", "spinfull"])
def test_the_kits_new_cases_meet_their_expectation(case: str) -> None:
    ok, why = cases.judge(case, verdict_for("h200-kit", case))
    assert ok, why


@pytest.mark.parametrize(
    ("case", "answers_of"), [("l2matmul", "spinfull"), ("spinfull", "l2matmul")]
)
def test_the_kits_new_cases_fail_on_the_wrong_figures(case: str, answers_of: str) -> None:
    ok, why = cases.judge(case, verdict_for("h200-kit", answers_of))
    assert not ok, why


def l2matmul_at(sm: float, power_mw: int) -> dict[str, Any]:
    """The L2-resident matmul's answers with its SM figure raised (a larger L2, a kernel with
    higher occupancy) and no tensor figure: only power tells it from a spin."""
    answers = json.loads((ANSWERS / "h200-kit" / "l2matmul.json").read_text())
    for poll in answers["devices"][0]["polls"]:
        poll["nvmlDeviceGetPowerUsage"] = power_mw
        if "nvmlGpmMetricsGet" in poll:
            poll["nvmlGpmMetricsGet"] = {"sm": sm * 100, "dram": 2.7}
    return answers


def test_an_l2_resident_matmul_above_the_sm_threshold_is_no_spin_by_its_power() -> None:
    computing = verdict_for("h200-kit", "l2matmul", answers=l2matmul_at(0.95, 690000))
    assert cases.judge("l2matmul", computing)[0], computing
    spinning = verdict_for("h200-kit", "l2matmul", answers=l2matmul_at(0.95, 140000))
    assert cases.judge("l2matmul", spinning) == (
        False, "judged a spin while the GPU computed near its power limit"
    )  # fmt: skip


def test_latency_case_names_the_spin_at_the_shipped_thresholds(capsys: Any) -> None:
    """Serving with progress (stats lines every 5 s), then the spin at tick 20: the verdict at
    the shipped thresholds, and how long after the onset it came (printed, not asserted)."""
    backend = replayed("h200-kit", "latency")
    window, sigs, th = Window(), load_signatures(), Thresholds()
    onset, named_at, v = 20, None, None
    for t in range(90):
        me = ProcInfo(SERVER_PID, 1, "python3", "gpu_live_child.py", 5.0 + t, None, "running")
        log = events([stats_line(1, 850.0 if t < onset else 0.0)]) if t % 5 == 0 else ()
        window.append(
            Observation(
                t=1000.0 + t, wall=1.7e9 + t, gpus=(backend.sample(0),), logs=log,
                procs=ProcSnapshot(SERVER_PID, True, (me,)),
                stacks=(stack(*SYNC_STACK, pid=SERVER_PID),) if t >= onset + 8 else (),
            )
        )  # fmt: skip
        v = to_dict(classify(window, sigs, th))
        if t < onset:
            assert v["state"] != "hung", v  # serving is no hang
        elif cases.judge("latency", v)[0]:
            named_at = t
            break
    assert named_at is not None, v
    print(f"latency (replayed, shipped thresholds): onset to verdict {named_at - onset} s")


@pytest.mark.parametrize("answer_set", SETS)
@pytest.mark.parametrize(
    ("case", "answers_of"), [("spin", "memcopy"), ("memcopy", "spin"), ("idle", "spin")]
)
def test_the_wrong_figures_fail_the_expectation(
    answer_set: str, case: str, answers_of: str
) -> None:
    ok, why = cases.judge(case, verdict_for(answer_set, answers_of))
    assert not ok, why


def test_nodram_spin_says_it_was_judged_by_power() -> None:
    v = verdict_for("nodram", "spin")
    spin = next(e["detail"] for e in v["evidence"] if e["kind"] == "gpu_spin")
    assert "no DRAM figures; judged by power 22 W of its 100 W limit" in spin
    assert "SM clock 2418 of 3003 MHz" in spin and "server CPU 1.00 core(s)" in spin


def test_spin_without_the_synchronize_frame_fails() -> None:
    v = verdict_for("h200", "spin")
    v["evidence"] = [e for e in v["evidence"] if e["kind"] != "stack"]
    assert cases.judge("spin", v) == (
        False,
        "gpu_kernel_spin without the synchronize frame in its stack evidence",
    )
    assert cases.judge("spin", None) == (False, "no verdict")


def test_gpm_first_poll_uses_rates_then_gpm_from_the_answers() -> None:
    backend = replayed("h200", "spin")
    first, second, third = (backend.sample(0) for _ in range(3))
    assert (first.method, first.sm, first.dram) == ("utilization_rates", 1.0, 0.0)
    assert (second.method, second.sm) == ("gpm", 1.0)  # as recorded on the H200, 2026-12-04
    assert second.dram is not None and second.dram < 0.0001
    assert second.tensor is None  # recorded before the watchdog asked GPM for it
    assert (third.power_w, third.power_limit_w, third.sm_clock_max_mhz) == (
        pytest.approx(164.414),
        700.0,
        1980.0,
    )
    assert third.pids == (SERVER_PID,)  # "CHILD" in the answers is the workload's PID


def test_recording_replays_to_the_same_samples() -> None:
    source = ReplayNvml.load(ANSWERS / "nodram" / "spin.json", SERVER_PID)
    recorder = RecordingNvml(real=source)
    live = NvmlBackend(module=recorder)
    live.init()
    seen = [live.sample(0) for _ in range(4)]
    recorded = json.loads(json.dumps(recorder.answers("test", child_pid=SERVER_PID)))
    assert recorded["devices"][0]["polls"][0]["nvmlDeviceGetComputeRunningProcesses"] == ["CHILD"]
    again = NvmlBackend(module=ReplayNvml(recorded, SERVER_PID))
    again.init()
    assert [again.sample(0) for _ in range(4)] == seen
    dram = recorded["devices"][0]["polls"][1]["nvmlGpmMetricsGet"]["dram"]
    assert dram == {"error": "NVML_ERROR_NOT_SUPPORTED"}


def test_exporter_check_reads_the_hang_gauge() -> None:
    page = (
        'hang_watchdog_gpu_sm_utilization_ratio{gpu="0",uuid="GPU-1"} 1.0\n'
        'hang_watchdog_hang{signature="gpu_kernel_spin"} 1.0\n'
    )
    assert cases.exporter_ok(page)[0]
    assert not cases.exporter_ok(page.replace("} 1.0\n", "} 0.0\n"))[0]
    assert not cases.exporter_ok(page.splitlines()[1])[0]


def run_script(*args: str, timeout: float = 420) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCH / "gpu_live.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=sim_env(),
        cwd=REPO_ROOT,
    )


def nvml_works() -> bool:
    backend = NvmlBackend()
    try:
        backend.init()
        return backend.device_count() > 0
    except Exception:
        return False
    finally:
        backend.shutdown()


def test_without_a_gpu_it_says_so_in_one_line_and_exits_0(tmp_path: Path) -> None:
    if nvml_works():
        pytest.skip("this host has a GPU: the script would run the live check instead")
    done = run_script("--out", str(tmp_path), timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_live: no NVIDIA GPU here (")
    assert "checked nothing" in lines[0]
    assert not list(tmp_path.iterdir())  # nothing judged, nothing written


@pytest.mark.slow
def test_rehearsal_runs_every_case_through_the_real_watchdog(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_script(
        "--rehearse", str(ANSWERS / "h200"), "--seconds", "20", "--out", str(out),
        "--cases", "spin,memcopy,idle,nccl",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    results = {r["case"]: r for r in json.loads((out / "gpu-live.json").read_text())}
    assert results["spin"]["verdict"]["signature"] == "gpu_kernel_spin"
    assert "exporter: hang_watchdog_hang" in results["spin"]["why"]
    assert results["memcopy"]["verdict"]["state"] != "hung"
    assert results["idle"]["verdict"]["state"] == "idle"
    assert results["nccl"]["skipped"] and "no recorded NVML answers" in results["nccl"]["why"]
    assert results["spin"]["nvml"]["child_in_process_list"] is True
    assert "| spin | gpm | 1.00 | 0.00 | 164 (700) | 1980 (1980) |" in done.stdout
    assert "gpu_live: daemon RSS " in done.stdout and "above the floor" in done.stdout


@pytest.mark.slow
def test_rehearsal_of_the_new_cases_prints_onset_to_verdict(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_script(
        "--rehearse", str(ANSWERS / "h200-kit"), "--cases", "l2matmul,spinfull,latency",
        "--seconds", "20", "--serve-s", "20", "--no-rss", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    results = {r["case"]: r for r in json.loads((out / "gpu-live.json").read_text())}
    assert results["l2matmul"]["verdict"]["signature"] != "gpu_kernel_spin"
    assert results["spinfull"]["verdict"]["signature"] == "gpu_kernel_spin"
    assert "onset to verdict " in results["latency"]["why"], results["latency"]["why"]


@pytest.mark.slow
def test_rehearsal_exits_1_when_an_expectation_fails(tmp_path: Path) -> None:
    answers = tmp_path / "answers"
    answers.mkdir()
    (answers / "memcopy.json").write_text((ANSWERS / "nodram" / "spin.json").read_text())
    done = run_script(
        "--rehearse", str(answers), "--cases", "memcopy", "--seconds", "20", "--no-rss",
        "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "NO: judged a spin while DRAM was busy" in done.stdout


@pytest.mark.slow
def test_sigterm_stops_every_child_and_exits_130(tmp_path: Path) -> None:
    import signal
    import time

    import psutil

    script = subprocess.Popen(
        [sys.executable, str(BENCH / "gpu_live.py"), "--rehearse", str(ANSWERS / "h200"),
         "--cases", "spin", "--out", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=sim_env(),
        cwd=REPO_ROOT,
    )  # fmt: skip
    try:
        deadline, kids = time.monotonic() + 60, []
        while time.monotonic() < deadline and len(kids) < 2:  # the workload and the watchdog
            time.sleep(0.5)
            kids = psutil.Process(script.pid).children(recursive=True)
        assert len(kids) >= 2, "the rehearsal never started its workload and watchdog"
        script.send_signal(signal.SIGTERM)
        _, err = script.communicate(timeout=60)
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()
    assert script.returncode == 130 and "every child stopped" in err
    alive = [p.pid for p in kids if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"children left running: {alive}"


@pytest.mark.gpu
@pytest.mark.slow
def test_live_gpu_run_meets_every_expectation(tmp_path: Path) -> None:
    if not nvml_works():
        pytest.skip("NVML cannot initialise here: the live check needs an NVIDIA GPU")
    done = run_script("--out", str(tmp_path), timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
