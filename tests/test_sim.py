"""The simulator prints vLLM's formats, serves vLLM's metrics, and hangs the way vLLM hangs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.simfixtures import SimHandle, cdn_factory, sim_factory  # noqa: F401 (fixtures)
from watchdog.sim import config, versions
from watchdog.sim.cdn import start_cdn
from watchdog.sim.output import format_bar, format_loading, format_meter

DATA = Path(__file__).parent / "data"
# Regexes for vLLM's tqdm bar (vllm/entrypoints/llm.py) and flashinfer/jit/core.py's log format.
PROGRESS_RE = (
    r"Processed prompts:\s+(\d+)%\|.*?\|\s*(\d+)/(\d+) \[([^<]+)<([^,]+), ([^,\]]+)"
    r"(?:, est\. speed input: ([\d.]+) toks/s, output: ([\d.]+) toks/s)?\]"
)
FLASHINFER_RE = (
    r"flashinfer\.jit: (Fetching|Acquired lock for|File downloaded successfully|"
    r"Downloading .+: attempt \d+ failed|Retrying in|Max retries reached)"
)
FLASHINFER_FORMAT_RE = (
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} - (INFO|WARNING|ERROR) - \w+\.py:\d+ - "
)
PREFIX_RE = r"^\((\w+) pid=(\d+)\) (INFO|WARNING|ERROR) \d\d-\d\d \d\d:\d\d:\d\d \[[\w/.]+:\d+\] "
STATS_RE = (
    r"\(APIServer pid=\d+\) INFO \d\d-\d\d \d\d:\d\d:\d\d \[loggers\.py:\d+\] Engine 000: "
    r"Avg prompt throughput: ([\d.]+) tokens/s, Avg generation throughput: ([\d.]+) tokens/s, "
    r"Running: (\d+) reqs, Waiting: (\d+) reqs, GPU KV cache usage: [\d.]+%, "
    r"Prefix cache hit rate: [\d.]+%"
)
MODEL_LOADING_RE = r"Model loading took [\d.]+ GiB(?: memory)? and [\d.]+ seconds"
VLLM_SAMPLES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:iteration_tokens_total_count",
    "vllm:iteration_tokens_total_sum",
)
THROUGHPUT_RE = r"^Throughput: [\d.]+ requests/s, [\d.]+ total tokens/s, [\d.]+ output tokens/s$"


def sample_lines(name: str) -> list[str]:
    """Non-empty lines of a captured upstream log in tests/data."""
    text = (DATA / name).read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]


def wait_until(cond, timeout: float = 30.0, what: str = "condition") -> None:
    """Poll `cond` until true; fail naming `what`."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def spin_samples(sim: SimHandle) -> list[dict]:
    """GPU samples with the deadlock shape (SM 0.99, DRAM 0)."""
    rows = [json.loads(line) for line in sim.gpu_samples()]
    return [r for r in rows if r["sm"] == 0.99 and r["dram"] == 0.0]


def py_spy(pid: int) -> str:
    """A real py-spy text dump of one process."""
    out = subprocess.run(
        ["py-spy", "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


# --- formats, checked against captured upstream lines -------------------------------------------


def test_tqdm_rendering_matches_captured_vllm_bars() -> None:
    first = sample_lines("g_vllm16050_processed_prompts_slowing.log")[0]
    post = "est. speed input: 0.00 toks/s, output: 0.00 toks/s"
    assert format_meter(0, 3273, 0.0, "Processed prompts", post) == first
    assert (
        f"|{format_bar(980, 3273)}|" in sample_lines("g_vllm16050_processed_prompts_slowing.log")[1]
    )
    loading = sample_lines("h_vllm44985_safetensors_weight_loading.log")
    assert format_loading(0, 4, 0.0) == loading[0]
    assert format_loading(2, 4, 2.48).startswith(loading[2][:56])
    capture = [ln for ln in sample_lines("h_vllm19794_torch_compile_and_cudagraph_capture.log")
               if ln.startswith("Capturing")][0]  # fmt: skip
    assert format_meter(67, 67, 14.23, "Capturing CUDA graphs") == capture


def test_config_ignores_vllm_flags_and_detects_fallback() -> None:
    cfg = config.parse(["--model", "X", "--attention-config.use_trtllm_attention=0"], env={})
    assert cfg.trtllm_disabled and cfg.model == "X"
    assert not config.parse(["--max-model-len", "4096"], env={}).trtllm_disabled
    assert config.parse([], env={"VLLM_USE_TRTLLM_ATTENTION": "0"}).trtllm_disabled
    assert not config.parse([], env={"VLLM_USE_TRTLLM_ATTENTION": "1"}).trtllm_disabled
    with pytest.raises(ValueError, match="NAME=VERSION"):
        versions.parse_spec("vllm")


# --- the stand-in CDN ----------------------------------------------------------------------------


def test_cdn_modes() -> None:
    port, stop = start_cdn("serve")
    try:
        resp = httpx.get(f"http://127.0.0.1:{port}/x.cubin", timeout=10)
        assert resp.status_code == 200 and resp.content
    finally:
        stop()
    port, stop = start_cdn("blackhole")
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.get(f"http://127.0.0.1:{port}/x.cubin", timeout=httpx.Timeout(10, read=0.5))
    finally:
        stop()
    port, stop = start_cdn("refuse")
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/", timeout=5)


# --- bench mode ----------------------------------------------------------------------------------


def test_bench_healthy_finishes_with_vllm_lines(sim_factory) -> None:  # noqa: F811
    sim = sim_factory("healthy", extra_args=["--num-prompts", "64", "--bench-s", "1"])
    assert sim.process.wait(timeout=60) == 0
    out = sim.stdout_file.read_text().splitlines()
    assert re.match(THROUGHPUT_RE, out[-3]), out[-3:]
    assert re.match(r"^Total num prompt tokens:  \d+$", out[-2])
    assert re.match(r"^Total num output tokens:  \d+$", out[-1])
    err = sim.stderr_file.read_bytes().decode()
    draws = [m.groups() for m in re.finditer(PROGRESS_RE, err)]
    assert draws[0][:3] == ("0", "0", "64") and draws[-1][:3] == ("100", "64", "64")
    assert "\rProcessed prompts:" in err  # redraws are \r-separated like tqdm's
    assert re.search(r"^Loading safetensors checkpoint shards: 100% Completed \| 4/4 ", err, re.M)
    engine_lines = [ln for ln in out if ln.startswith("(EngineCore_DP0")]
    assert engine_lines and all(re.match(PREFIX_RE, ln) for ln in engine_lines)
    text = "\n".join(out)
    assert re.search(MODEL_LOADING_RE, text)
    assert re.search(r"Graph capturing finished in \d+ secs, took [\d.]+ GiB", text)
    assert re.search(r"init engine \(profile, create kv cache, warmup model\) took [\d.]+", text)


@pytest.mark.parametrize(
    ("args", "env"),
    [(["--attention-config.use_trtllm_attention=0"], {}), ([], {"VLLM_USE_TRTLLM_ATTENTION": "0"})],
)
def test_hang_unless_fallback_healthy_with_fallback(sim_factory, args, env) -> None:  # noqa: F811
    sim = sim_factory("hang_unless_fallback", extra_args=["--num-prompts", "32", *args], env=env)
    assert sim.process.wait(timeout=60) == 0


def test_kernel_deadlock_freezes_bar_at_zero(sim_factory) -> None:  # noqa: F811
    sim = sim_factory("hang_unless_fallback", extra_args=["--num-prompts", "768"])
    sim.wait_for_line(r"Processed prompts:\s+0%")
    wait_until(lambda: len(spin_samples(sim)) >= 4, what="4 spin GPU samples")
    assert sim.process.poll() is None
    draws = [m.groups() for m in re.finditer(PROGRESS_RE, sim.stderr_file.read_bytes().decode())]
    assert draws and all(d[1] == "0" and d[2] == "768" for d in draws)
    engine = sim.engine_pid()
    assert all(s["pids"] == [engine] and s["cc"] == "10.3" for s in spin_samples(sim))
    assert "synchronize (watchdog/sim/torch_stub/cuda/__init__.py" in py_spy(engine)


def test_cubin_download_stall_blocks_in_download_file(sim_factory, cdn_factory) -> None:  # noqa: F811
    port = cdn_factory("blackhole")
    sim = sim_factory("cubin_download_stall", extra_args=["--cdn-url", f"http://127.0.0.1:{port}/"])
    fetch = sim.wait_for_line(FLASHINFER_RE)
    line = fetch.string
    # A line logged while the bar is open follows the bar on the same line, as in real logs.
    assert re.search(FLASHINFER_FORMAT_RE + r"flashinfer\.jit: Fetching cubin \S+ from ", line)
    assert f"http://127.0.0.1:{port}/" in line
    engine = psutil.Process(sim.engine_pid())
    assert "VLLM::EngineCore" in engine.cmdline()

    def established() -> bool:
        return any(
            c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
            for c in engine.net_connections(kind="tcp")
        )

    wait_until(established, what="ESTABLISHED socket from EngineCore to the CDN")
    dump = py_spy(engine.pid)
    for frame in ("download_file", "get_cubin", "get_cubin_callback", "http/client.py"):
        assert frame in dump, dump
    wait_until(lambda: len(spin_samples(sim)) >= 2, what="spin GPU samples")
    assert not re.search(r"Processed prompts:\s+[1-9]", sim.stderr_file.read_bytes().decode())


def test_refused_cdn_logs_retries(sim_factory, cdn_factory) -> None:  # noqa: F811
    port = cdn_factory("refuse")
    sim = sim_factory("cubin_download_stall", extra_args=["--cdn-url", f"http://127.0.0.1:{port}"])
    failed = sim.wait_for_line(r"flashinfer\.jit: Downloading (\S+): attempt 1 failed: ")
    assert (
        re.search(FLASHINFER_FORMAT_RE + "flashinfer", failed.string)
        and " - WARNING - " in failed.string
    )
    sim.wait_for_line(r"flashinfer\.jit: Retrying in 5 seconds\.\.\.$")


def test_served_cubins_let_the_engine_run(sim_factory, cdn_factory) -> None:  # noqa: F811
    port = cdn_factory("serve")
    args = ["--cdn-url", f"http://127.0.0.1:{port}/", "--num-prompts", "32"]
    sim = sim_factory("cubin_download_stall", extra_args=args)
    assert sim.process.wait(timeout=60) == 0
    assert "flashinfer.jit: File downloaded successfully: " in sim.log_text()


def test_slow_loading_advances_with_real_reads(sim_factory) -> None:  # noqa: F811
    sim = sim_factory("slow_loading", extra_args=["--shards", "20", "--shard-s", "0.5"])
    sim.wait_for_line(r"Loading safetensors checkpoint shards: +\d+% Completed \| 1/20 ")
    engine = psutil.Process(sim.engine_pid())
    before = engine.io_counters().read_chars
    sim.wait_for_line(r"Loading safetensors checkpoint shards: +\d+% Completed \| 3/20 ")
    assert engine.io_counters().read_chars > before
    rows = [json.loads(line) for line in sim.gpu_samples()]
    assert rows and all(r["sm"] < 0.1 for r in rows)


# --- serve mode ----------------------------------------------------------------------------------


def scrape(sim: SimHandle) -> dict[str, float]:
    """/metrics as {sample name: value}, parsed by prometheus_client; labels checked."""
    text = httpx.get(f"http://127.0.0.1:{sim.port}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("vllm:"):
                assert s.labels["model_name"] and s.labels["engine"] == "0"
                if "le" not in s.labels:
                    out[s.name] = s.value
    return out


def test_serve_healthy_metrics_health_and_completions(sim_factory) -> None:  # noqa: F811
    sim = sim_factory("healthy", mode="serve", extra_args=["--stats-interval", "0.5"])
    assert sim.stdout_file.read_text().splitlines()[0] == f"SIM_PORT={sim.port}"
    sim.wait_for_line(r"\(APIServer pid=\d+\) INFO:     Application startup complete\.")
    base = f"http://127.0.0.1:{sim.port}"
    assert httpx.get(f"{base}/health", timeout=10).status_code == 200
    assert httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]["id"]
    first = scrape(sim)
    for name in VLLM_SAMPLES:
        assert name in first, name
    resp = httpx.post(f"{base}/v1/completions", json={"model": "m", "prompt": "hi"}, timeout=30)
    assert resp.status_code == 200 and resp.json()["choices"][0]["text"]
    gen = "vllm:generation_tokens_total"
    wait_until(lambda: scrape(sim)[gen] > first[gen], what="generation tokens to advance")
    assert scrape(sim)["vllm:num_requests_running"] > 0
    stats = sim.wait_for_line(STATS_RE)
    assert float(stats.group(2)) > 0 and int(stats.group(3)) > 0


def test_serve_hang_keeps_health_200_and_completions_hang(sim_factory) -> None:  # noqa: F811
    sim = sim_factory("kernel_deadlock", mode="serve", extra_args=["--stats-interval", "0.5"])
    sim.wait_for_line(r"Application startup complete\.")
    base = f"http://127.0.0.1:{sim.port}"
    assert httpx.get(f"{base}/health", timeout=10).status_code == 200
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{base}/v1/completions", json={"prompt": "hi"}, timeout=httpx.Timeout(10, read=2)
        )
    before = scrape(sim)
    wait_until(lambda: len(spin_samples(sim)) >= 4, what="spin samples")
    after = scrape(sim)
    assert after["vllm:num_requests_running"] > 0
    assert after["vllm:generation_tokens_total"] == before["vllm:generation_tokens_total"]
    assert httpx.get(f"{base}/health", timeout=10).status_code == 200
    assert "Engine 000:" not in sim.log_text()  # zero intervals are demoted to DEBUG


def test_engine_dead_turns_health_503(sim_factory) -> None:  # noqa: F811
    sim = sim_factory("engine_dead", mode="serve", extra_args=["--die-after-s", "1"])
    base = f"http://127.0.0.1:{sim.port}"
    wait_until(lambda: sim.log_text().count("Application startup complete") > 0, what="startup")
    wait_until(lambda: httpx.get(f"{base}/health", timeout=10).status_code == 503, what="503")
    dead = sim.wait_for_line(r"vllm\.v1\.engine\.exceptions\.EngineDeadError: ")
    upstream = sample_lines("e_ascend5117_compose_prefix_enginedeaderror.log")[-1]
    assert dead.string.split("] ", 1)[1] == upstream.split("] ", 1)[1]
    sim.wait_for_line(r"\(EngineCore_DP0 pid=\d+\) ERROR .*\[core\.py:\d+\] TimeoutError$")
    resp = httpx.post(f"{base}/v1/completions", json={"prompt": "hi"}, timeout=10)
    assert resp.status_code == 500


def test_fake_versions_visible_through_proc_environ(sim_factory) -> None:  # noqa: F811
    spec = "vllm=0.11.0,flashinfer-python=0.6.7"
    sim = sim_factory("healthy", mode="serve", extra_args=["--fake-versions", spec])
    sim.wait_for_line(r"Application startup complete\.")
    raw = Path(f"/proc/{sim.pid}/environ").read_bytes().split(b"\0")
    env = dict(item.decode().split("=", 1) for item in raw if b"=" in item)
    code = (
        "import importlib.metadata as m; print(m.version('vllm'), m.version('flashinfer-python'))"
    )
    out = subprocess.run([os.readlink(f"/proc/{sim.pid}/exe"), "-c", code], env=env,
                         capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    assert out.stdout.split() == ["0.11.0", "0.6.7"]


def test_sigterm_stops_the_whole_tree_with_tp_workers(sim_factory) -> None:  # noqa: F811
    sim = sim_factory("kernel_deadlock", mode="serve", extra_args=["--tp", "2"])
    workers = [sim.child_pid(f"VLLM::Worker_TP{rank}") for rank in (0, 1)]
    tree = [psutil.Process(p) for p in [sim.engine_pid(), *workers]]
    wait_until(lambda: len(spin_samples(sim)) >= 2, what="spin samples")
    assert {tuple(s["pids"]) for s in spin_samples(sim)} == {(workers[0],)}
    os.kill(sim.pid, signal.SIGTERM)
    assert sim.process.wait(timeout=20) == 0
    gone, alive = psutil.wait_procs(tree, timeout=20)
    assert not alive


def test_sglang_and_trtllm_gauges_are_as_of_the_last_batch_that_returned() -> None:
    # SGLang writes its scheduler gauges when it reports a batch, TensorRT-LLM from a finished
    # iteration's stats: a scheduled batch that never returns leaves the warm-up's 0.
    from watchdog.sim.link import EngineLink

    link = EngineLink([])
    link._apply({"ev": "step", "running": 0, "waiting": 0})  # the warm-up returned
    link._apply({"ev": "batch", "running": 8, "waiting": 2})  # the first large batch began
    st = link.state
    assert st.ready and (st.running, st.waiting) == (8, 2)
    assert (st.batch_running, st.batch_waiting) == (0, 0)
    link._apply({"ev": "step", "running": 8, "waiting": 2})  # it returned
    assert (st.batch_running, st.batch_waiting) == (8, 2)
