"""Exit codes and output of real runs: `diagnose || page` hears stalled and dead, a closed
`--log-file -` is reported, `--match` waits in words, and the demo prints one verdict block."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.simfixtures import REPO_ROOT, run_watchdog, sim_env, stop_process

pytestmark = pytest.mark.slow
QUIET = ("--no-cdn-default", "--gpu-source", "none", "--no-stacks", "--tick-s", "0.2")
STATS = (
    "(APIServer pid=9) INFO 05-30 09:55:2{n} [loggers.py:123] Engine 000: Avg prompt "
    "throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 3 reqs, "
    "Waiting: 0 reqs, GPU KV cache usage: 1.0%, Prefix cache hit rate: 0.0%\n"
)


def test_diagnose_exits_1_for_a_stalled_server(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("")

    def write() -> None:  # vLLM's stats line: requests running, nothing generated
        for n in range(10):
            time.sleep(0.4)
            with log.open("a") as f:
                f.write(STATS.format(n=n))

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    done = run_watchdog(
        "diagnose", "--log-file", str(log), *QUIET, "--blind-stall-after-s", "1",
        "--stall-after-s", "1", "--suspect-after-s", "1", "--duration", "5",
    )  # fmt: skip
    writer.join()
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stdout.startswith("STALLED\n"), done.stdout


def test_diagnose_exits_1_for_a_dead_server() -> None:
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"])
    try:
        done = run_watchdog("diagnose", "--pid", str(server.pid), *QUIET, "--duration", "4")
    finally:
        stop_process(server)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stdout.startswith("DEAD\n") and "the server process is gone" in done.stdout


def test_run_reports_the_end_of_piped_input_and_exits_1(tmp_path: Path) -> None:
    errfile = tmp_path / "stderr"
    with errfile.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "watchdog", "run", "--log-file", "-", *QUIET,
             "--metrics-addr", "off"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err, env=sim_env(),
            cwd=REPO_ROOT,
        )  # fmt: skip
    try:
        assert proc.stdin is not None
        proc.stdin.write(b"(APIServer pid=9) INFO 05-30 09:55:22 [api_server.py:1] starting\n")
        proc.stdin.close()  # the piped server died
        code = proc.wait(timeout=30)
    finally:
        stop_process(proc)
    assert code == 1, errfile.read_text()
    assert "standard input ended: the piped server is gone" in errfile.read_text()


def test_run_with_a_match_that_finds_nothing_waits_and_says_so(tmp_path: Path) -> None:
    errfile = tmp_path / "stderr"
    with errfile.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "watchdog", "run", "--match", "no-such-server-[q]zx",
             *QUIET, "--metrics-addr", "off"],
            stdout=subprocess.DEVNULL, stderr=err, env=sim_env(), cwd=REPO_ROOT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while "hang-watchdog state:" not in errfile.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, errfile.read_text()
            time.sleep(0.1)
    finally:
        stop_process(proc)
    text = errfile.read_text()
    assert "no process matches --match 'no-such-server-[q]zx' yet; waiting" in text
    assert "no server process found" in text and "process is gone" not in text


def test_demo_prints_one_verdict_block_in_one_timestamp_format() -> None:
    done = run_watchdog("demo", timeout=180)
    assert done.returncode == 0, (done.stdout, done.stderr)
    both = done.stdout + done.stderr
    assert both.count("HUNG  cubin_download_stall (confidence") == 1, both
    assert max(len(line) for line in done.stdout.splitlines()) <= 200
    stamps = re.findall(r"^(\S+) hang-watchdog ", both, flags=re.M)
    assert stamps and all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", s) for s in stamps)
    assert "does not exist (yet)" not in both  # attached once the simulator's files exist
    assert (
        "remediation off; with --remediate it would restart with fallback disable_trtllm_attention"
        in both
    )
    titles = re.findall(r"pid \d+ \(([^)]*)\) thread", both)
    assert titles and all(t.endswith((" …", "vllm_sim")) or " " in t for t in titles), titles
    assert not [t for t in titles if re.search(r"\.vll$", t)], titles
