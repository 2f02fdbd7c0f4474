"""`hang-watchdog replay`: bundles from real runs, timelines, plain logs, stdin, bad input."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.logsamples import NAMED
from tests.simfixtures import sim_env, start_sim

DATA = Path(__file__).parent / "data"
LOGS = DATA / "logs"
SHORT = ["--stall-after-s", "6", "--suspect-after-s", "3", "--stack-second-after-s", "1"]
SHORT += ["--gpu-spin-for-s", "4"]

EXPECTED = NAMED
HEALTHY = sorted(p.name for p in LOGS.glob("[fgh]_*.log"))  # serving, bench, loading/compiling

# An operator signature that the kernel_deadlock simulator's frozen progress bar matches.
OPERATOR_SIGNATURE = """\
schema = 1

[[signature]]
id = "site_bench_stuck_at_zero"
title = "Site rule: the benchmark never processed a prompt"
when = "stalled"
priority = 1000
min_confidence = 0.5
fix = "Page the inference on-call."

[[signature.evidence]]
kind = "log"
pattern = 'Processed prompts:\\s+0%'
within_s = 3600
decisive = true
weight = 0.6
label = "benchmark progress bar frozen at 0%"
"""


def replay(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m watchdog replay ...`; text output."""
    done = subprocess.run(
        [sys.executable, "-m", "watchdog", "replay", *args],
        input=stdin,
        capture_output=True,
        timeout=120,
        env=sim_env(),
    )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


def named(result: subprocess.CompletedProcess[str]) -> list[str]:
    """Signature ids from `replay --json` of a plain log."""
    assert result.returncode in (0, 1), result.stderr
    return [m["signature"] for m in json.loads(result.stdout)["matches"]]


@pytest.fixture(scope="module")
def live_bundle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An incident bundle written by a real `diagnose` of a hanging simulator (CC 10.0)."""
    tmp = tmp_path_factory.mktemp("live")
    sim = start_sim(tmp, "kernel_deadlock", extra_args=["--cc", "10.0"])
    try:
        args = ["--pid", str(sim.pid), "--gpu-source", f"file:{sim.gpu_file}"]
        args += ["--log-file", str(sim.log_file), *SHORT, "--no-cdn-default"]
        args += ["--duration", "90", "--until-hang", "--incident-dir", str(tmp / "inc")]
        done = subprocess.run(
            [sys.executable, "-m", "watchdog", "diagnose", *args],
            capture_output=True,
            text=True,
            timeout=150,
            env=sim_env(),
        )
    finally:
        sim.stop()
    assert done.returncode == 1, f"{done.stdout}\n{done.stderr[-3000:]}"
    bundles = list((tmp / "inc").iterdir())
    assert len(bundles) == 1, bundles
    yield bundles[0]


def recorded_signature(bundle: Path) -> str:
    return json.loads((bundle / "incident.json").read_text(encoding="utf-8"))["verdict"][
        "signature"
    ]


def test_replay_live_bundle_gives_the_recorded_verdict(live_bundle: Path) -> None:
    assert recorded_signature(live_bundle) == "gpu_kernel_spin"
    done = replay(str(live_bundle), "--json")
    assert done.returncode == 1, done.stderr
    out = json.loads(done.stdout)
    assert out["verdict"]["signature"] == "gpu_kernel_spin"
    assert out["changes"] == [], out["changes"]
    text = replay(str(live_bundle))
    assert "HUNG  gpu_kernel_spin (confidence" in text.stdout
    assert "compared with the recorded verdict: no change" in text.stdout


def test_replay_with_operator_signature_changes_the_verdict(
    live_bundle: Path, tmp_path: Path
) -> None:
    sig_file = tmp_path / "site.toml"
    sig_file.write_text(OPERATOR_SIGNATURE, encoding="utf-8")
    done = replay(str(live_bundle), "--signatures", str(sig_file))
    assert done.returncode == 1, done.stderr
    assert "HUNG  site_bench_stuck_at_zero (confidence" in done.stdout, done.stdout
    assert "signature: gpu_kernel_spin -> site_bench_stuck_at_zero" in done.stdout, done.stdout


def test_replay_of_a_timeline_file_uses_default_thresholds(
    live_bundle: Path, tmp_path: Path
) -> None:
    """A bare timeline carries no thresholds: the run stalled 6 s, under the default 15 s."""
    timeline = tmp_path / "copied-timeline.jsonl"
    shutil.copy(live_bundle / "timeline.jsonl", timeline)
    done = replay(str(timeline), "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["verdict"]["state"] == "serving" and out["recorded"] is None
    assert "0/768" in out["verdict"]["reason"], out["verdict"]


def test_replay_of_a_bundle_timeline_uses_the_recorded_thresholds(live_bundle: Path) -> None:
    done = replay(str(live_bundle / "timeline.jsonl"), "--json")
    assert done.returncode == 1, done.stdout
    assert json.loads(done.stdout)["verdict"]["signature"] == "gpu_kernel_spin"


def test_replay_stored_bundle_from_a_real_run() -> None:
    """The unedited bundle of a real CC 10.3 run in tests/data/replay still replays the same."""
    bundle = DATA / "replay" / "trtllm_bundle"
    done = replay(str(bundle))
    assert done.returncode == 1, done.stderr
    assert "HUNG  trtllm_attention_deadlock (confidence" in done.stdout
    changes = json.loads(replay(str(bundle), "--json").stdout)["changes"]
    # Same verdict; evidence may differ only in how a process title is shortened (the bundle
    # predates cutting titles at a word boundary instead of mid-word, and the power a spin's
    # evidence now shows).
    assert not [c for c in changes if not c.startswith(("+ evidence:", "- evidence:"))], changes

    def untitled(change: str) -> str:
        change = re.sub(r"pid (\d+) \(.*?\) thread", r"pid \1 thread", change[2:])
        return re.sub(r", power [^,]*? for (\d+ s)", r" for \1", change)

    added = sorted(untitled(c) for c in changes if c.startswith("+"))
    removed = sorted(untitled(c) for c in changes if c.startswith("-"))
    assert added == removed, changes


@pytest.mark.parametrize(("name", "signature"), sorted(EXPECTED.items()))
def test_replay_plain_logs_name_the_signature(name: str, signature: str) -> None:
    done = replay(str(LOGS / name), "--json")
    assert done.returncode == 1
    assert named(done)[0] == signature


def test_replay_healthy_logs_name_nothing() -> None:
    assert len(HEALTHY) >= 10
    found = {}
    for name in HEALTHY:
        done = replay(str(LOGS / name), "--json")
        found[name] = named(done)
        assert done.returncode == (1 if found[name] else 0)
    assert {k: v for k, v in found.items() if v} == {}


def prefixed(name: str, prefix: str) -> bytes:
    lines = (LOGS / name).read_text(encoding="utf-8").splitlines()
    return "".join(prefix + line + "\n" for line in lines).encode()


# Prefix shapes copied from real samples: journald short format (b_proxmox2047), Docker's
# --timestamps (f_tt3359), Compose's service column (e_ascend5117).
PREFIXES = [
    "Aug 19 18:34:27 vllm vllm[8727]: ",
    "2026-05-12T07:54:39.312201059Z ",
    "vllm-1  | ",
]


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize(
    ("name", "signature"),
    [
        ("b_kserve4657_nvcc_not_found.log", "jit_toolchain_missing"),
        ("d_vllm5458_nccl_watchdog_timeout.log", "collective_hang"),
    ],
)
def test_replay_reads_stdin_with_collector_prefixes(name: str, signature: str, prefix: str) -> None:
    done = replay("-", "--json", stdin=prefixed(name, prefix))
    assert done.returncode == 1, done.stderr
    assert named(done)[0] == signature


def test_replay_stdin_plain_text() -> None:
    done = replay("-", stdin=(LOGS / "c_pt177472_nvls_bind_cuda401.log").read_bytes())
    assert done.returncode == 1
    assert done.stdout.startswith("nvls_multicast_failure")
    assert "matched:" in done.stdout and "fix:" in done.stdout


@pytest.mark.parametrize(
    "make",
    [
        lambda tmp: [str(tmp / "no-such-file.log")],
        lambda tmp: [str(tmp)],  # a directory without incident.json
        lambda tmp: [
            str(DATA / "replay" / "trtllm_bundle"),
            "--signatures",
            str(tmp / "nope.toml"),
        ],
    ],
    ids=["missing-file", "not-a-bundle", "missing-signature-file"],
)
def test_replay_unreadable_input_exits_2(tmp_path: Path, make: object) -> None:
    args: Sequence[str] = make(tmp_path)  # type: ignore[operator]
    done = replay(*args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "hang-watchdog" in done.stderr and done.stdout == ""


def test_replay_corrupt_timeline_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "timeline.jsonl"
    bad.write_text('{"t": 1.0, "wall": 2.0}\nnot json at all\n', encoding="utf-8")
    done = replay(str(bad))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert str(bad) in done.stderr


def test_replay_timeline_on_stdin_matches_the_same_file(tmp_path: Path) -> None:
    """`replay -` parses the bytes it read; it used to open a file named "-" and crash."""
    timeline = tmp_path / "timeline-copy.jsonl"  # outside its bundle: default thresholds
    shutil.copy(DATA / "replay" / "trtllm_bundle" / "timeline.jsonl", timeline)
    from_file = replay(str(timeline), "--json")
    from_stdin = replay("-", "--json", stdin=timeline.read_bytes())
    assert from_stdin.returncode == from_file.returncode == 0, from_stdin.stderr
    assert json.loads(from_stdin.stdout) == json.loads(from_file.stdout)
    assert json.loads(from_stdin.stdout)["verdict"]["state"] == "serving"


@pytest.mark.parametrize(
    ("stdin", "needle"),
    [
        (b'{"t": 1.0, "wall": 2.0}\nnot json at all\n', "<stdin>:2: not valid JSON"),
        (b'{"t": 1.0, "wall": 2.0, "gpus": [{"name": "x"}]}\n', "<stdin>:1: not an Observation"),
        (b'{"t": 1.0, "wall": 2.0}\n\xff\xfe\n', "<stdin>: not a text file"),
        (b"", "<stdin> is empty"),
        (b"\n  \n", "<stdin> is empty"),
    ],
    ids=["bad-line", "not-an-observation", "not-utf8", "empty", "blank"],
)
def test_replay_bad_stdin_is_a_clear_error_and_exits_2(stdin: bytes, needle: str) -> None:
    done = replay("-", stdin=stdin)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert needle in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_replay_json_of_a_log_is_the_object_the_docs_describe(tmp_path: Path) -> None:
    """docs/evidence-and-incidents.md names the keys of `replay --json LOG`; keep them true."""
    log = tmp_path / "vllm.log"
    log.write_text("INFO 12-01 10:00:00 [core.py:1] Initializing a V1 LLM engine (v0.32.0)\n")
    proc = subprocess.run(
        [sys.executable, "-m", "watchdog", "replay", "--json", str(log)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    got = json.loads(proc.stdout)
    documented = ("matches", "stacks_in_log", "open_operations", "points_to", "stuck")
    assert isinstance(got, dict) and set(documented) | {"stuck_verdict", "parsed"} <= set(got)
