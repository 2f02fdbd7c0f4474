"""Live GPU proof: the watchdog judges a real spin, a memory-bound wait and an idle context.

    python benchmarks/gpu_live.py [--out DIR] [--seconds 25] [--cases spin,memcopy,...]

On a machine with an NVIDIA GPU it starts each workload of benchmarks/gpu_live_child.py as a
child it owns, runs `hang-watchdog diagnose --pid CHILD --gpu-source nvml --no-cdn-default`
against it (and `run` with the exporter for the spin), reads NVML itself meanwhile (through
the watchdog's own NvmlBackend, timing each poll and recording every answer), and prints one
table row per case. Exit 0 only when every expectation holds; without a GPU it says so in one
line and exits 0 having checked nothing. The `latency` case runs at the shipped thresholds and
prints the time from the spin's onset to the verdict; at the end the daemon's RSS is printed
beside a floor process (Python + pynvml + nvmlInit, benchmarks/rss_floor.py).
`--rehearse DIR` runs the same cases with CPU stand-ins and the `file:` GPU source fed from
recorded NVML answers (tests/data/nvml/...).
Every child runs in its own process group and is stopped on exit, SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the sibling modules, whatever the working directory

import gpu_live_cases as cases  # noqa: E402
from gpu_live_procs import Procs, find_pyspy, free_port, scrape  # noqa: E402
from rss_floor import measure as measure_rss  # noqa: E402

from watchdog.core.model import GpuSample  # noqa: E402
from watchdog.sources.gpu.backend import GpuError  # noqa: E402
from watchdog.sources.gpu.nvml import NvmlBackend  # noqa: E402

# Short thresholds: the ratios are what is under test, not the 15 s production timings.
TIMING = [
    "--tick-s", "1", "--window-s", "180", "--stall-after-s", "10", "--suspect-after-s", "4",
    "--gpu-spin-for-s", "6", "--stack-second-after-s", "2", "--stack-deadline-s", "8",
]  # fmt: skip


class Probe(threading.Thread):
    """Polls every GPU once a second through NvmlBackend; keeps samples and each poll's cost."""

    def __init__(self, backend: NvmlBackend, gpu_file: Path | None = None) -> None:
        super().__init__(daemon=True)
        self.backend, self.gpu_file = backend, gpu_file
        self.figures = cases.Figures()
        self.all: list[GpuSample] = []
        self._halt = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        try:
            count = self.backend.device_count()
            self.backend.driver_version()  # so that a recording keeps it
            while not self._halt.is_set():
                got = []
                for i in range(count):
                    t0 = time.perf_counter()
                    got.append(self.backend.sample(i))
                    self.figures.poll_ms.append((time.perf_counter() - t0) * 1000.0)
                self.all.extend(got)
                if self.gpu_file is not None:
                    _append_samples(self.gpu_file, got)
                self._halt.wait(1.0)
        except GpuError as exc:
            self.error = str(exc)

    def stop(self, child_pid: int | None) -> cases.Figures:
        self._halt.set()
        self.join(timeout=10)
        gpu = cases.pick_gpu(self.all, child_pid)
        self.figures.samples = [g for g in self.all if g.index == gpu]
        return self.figures


def _append_samples(path: Path, samples: list[GpuSample]) -> None:
    """The probe's samples as `file:` source lines (ratios, host PIDs, Unix time)."""
    keys = (
        "uuid", "name", "cc", "power_w", "sm_clock_mhz", "power_limit_w", "sm_clock_max_mhz",
        "tensor",
    )  # fmt: skip
    with path.open("a", encoding="utf-8") as fh:
        for g in samples:
            if g.sm is None:
                continue
            line: dict[str, Any] = {"gpu": g.index, "sm": g.sm, "dram": g.dram, "ts": time.time()}
            line.update({k: getattr(g, k) for k in keys if getattr(g, k) is not None})
            line["pids"] = list(g.pids)
            fh.write(json.dumps(line) + "\n")


class Session:
    """One run of every case: the children, the watchdogs, the probe, the results."""

    def __init__(self, args: argparse.Namespace, work: Path, procs: Procs) -> None:
        self.args, self.work, self.procs = args, work, procs
        self.rows: list[list[str]] = []
        self.results: list[dict[str, Any]] = []
        self.pyspy = find_pyspy()

    def backend(self, case: str, child_pid: int) -> tuple[NvmlBackend, Any]:
        from nvml_answers import RecordingNvml, ReplayNvml  # needs pynvml: not on the no-GPU path

        if self.args.rehearse:
            module: Any = ReplayNvml.load(Path(self.args.rehearse) / f"{case}.json", child_pid)
        else:
            module = RecordingNvml()
        return NvmlBackend(module=module), module

    def watchdog(
        self, cmd: str, pid: int, log: Path, gpu_source: str, *extra: str, shipped: bool = False
    ) -> list[str]:
        base = self.args.watchdog.split() or [sys.executable, "-m", "watchdog"]
        argv = [*base, cmd, "--pid", str(pid), "--gpu-source", gpu_source, "--no-cdn-default"]
        argv += ["--log-file", str(log), *([] if shipped else TIMING), *extra]
        return argv + (["--pyspy", self.pyspy] if self.pyspy else [])

    def run_case(self, case: str) -> bool:
        log, ready = self.work / f"{case}.log", self.work / f"{case}.ready"
        gpu_file = self.work / f"{case}.gpu.jsonl" if self.args.rehearse else None
        gpu_source = f"file:{gpu_file}" if gpu_file else "nvml"
        if self.args.rehearse and not (Path(self.args.rehearse) / f"{case}.json").is_file():
            return self.skip_or_fail(case, f"no recorded NVML answers {case}.json to rehearse")
        shipped = case in cases.SHIPPED_THRESHOLDS
        extra = ["--serve-s", str(self.args.serve_s)] if case == "latency" else []
        child = self.procs.start_child(case, log, ready, cpu=bool(self.args.rehearse), extra=extra)
        info = self.procs.wait_ready(child, ready, self.args.startup_s)
        if "error" in info:
            return self.skip_or_fail(case, info["error"])
        backend, module = self.backend(case, child.pid)
        try:
            backend.init()
        except GpuError as exc:
            self.procs.stop(child)
            return self.skip_or_fail(case, f"NVML probe: {exc}")
        probe = Probe(backend, gpu_file)
        probe.start()
        verdict, why_none = self.diagnose(child.pid, log, gpu_source, shipped)
        judged_at = time.time()
        exporter = self.exporter(child.pid, log, gpu_source) if case == "spin" else None
        figures = probe.stop(child.pid).summary(child.pid)
        backend.shutdown()
        self.procs.stop(child)
        ok, why = cases.judge(case, verdict) if verdict else (False, why_none)
        if exporter is not None:
            ok, why = ok and exporter[0], f"{why}; exporter: {exporter[1]}"
        if probe.error:
            ok, why = False, f"{why}; NVML probe: {probe.error}"
        if shipped:
            onset = ready.with_name(ready.name + ".onset")
            why = f"{why}; {cases.onset_to_verdict(onset, judged_at)}"
        self.record(case, figures, verdict, (ok, why), info, module)
        return ok

    def diagnose(
        self, pid: int, log: Path, gpu_source: str, shipped: bool = False
    ) -> tuple[dict | None, str]:
        argv = self.watchdog("diagnose", pid, log, gpu_source, shipped=shipped)
        # At the shipped thresholds: the serving phase, then stall_after_s and gpu_spin_for_s.
        seconds = self.args.seconds + (self.args.serve_s + 30 if shipped else 0)
        argv += ["--duration", str(seconds), "--until-hang", "--json"]
        code, out, err = self.procs.run(argv, timeout_s=seconds + 60)
        try:
            return json.loads(out), ""
        except json.JSONDecodeError:
            return None, f"diagnose exited {code} without a verdict: {err.strip()[-300:]}"

    def exporter(self, pid: int, log: Path, gpu_source: str) -> tuple[bool, str]:
        port = free_port()
        argv = self.watchdog("run", pid, log, gpu_source, "--metrics-addr", f"127.0.0.1:{port}")
        proc = self.procs.start(argv, self.work / "run.stderr")
        deadline, last = time.monotonic() + self.args.seconds + 20, "no scrape answered"
        try:
            while time.monotonic() < deadline:
                text = scrape(f"http://127.0.0.1:{port}/metrics")
                if text is not None:
                    ok, last = cases.exporter_ok(text)
                    if ok:
                        return ok, last
                time.sleep(1.0)
            return False, last
        finally:
            self.procs.stop(proc)

    def skip_or_fail(self, case: str, error: str) -> bool:
        optional = cases.BY_NAME[case].optional
        why = f"skipped: {error}" if optional else f"could not start: {error}"
        self.rows.append([case, *(["-"] * 9), cases.BY_NAME[case].expect, why])
        self.results.append({"case": case, "ok": optional, "skipped": optional, "why": why})
        return optional

    def record(
        self, case: str, figures: dict[str, Any], verdict: dict[str, Any] | None,
        result: tuple[bool, str], info: dict[str, Any], module: Any,
    ) -> None:  # fmt: skip
        ok, why = result
        self.rows.append(cases.row(case, figures, verdict, ok, why))
        self.results.append(
            {"case": case, "ok": ok, "why": why, "workload": info, "nvml": figures,
             "verdict": verdict}
        )  # fmt: skip
        if hasattr(module, "answers"):  # RecordingNvml: keep what the driver said
            answers = self.args.out / "nvml-answers"
            answers.mkdir(parents=True, exist_ok=True)
            note = f"recorded by benchmarks/gpu_live.py, case {case}, {time.strftime('%F %T')}"
            recorded = module.answers(note, child_pid=info.get("pid"))
            (answers / f"{case}.json").write_text(json.dumps(recorded, indent=1))


def no_gpu_reason() -> str | None:
    """Why this machine cannot run the live check, or None when NVML sees a GPU."""
    backend = NvmlBackend()
    try:
        backend.init()
        count = backend.device_count()
    except GpuError as exc:
        return str(exc).split(":")[0] if "not available" in str(exc) else str(exc)
    finally:
        backend.shutdown()
    return None if count > 0 else "NVML reports no GPU"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu-live-out"))
    p.add_argument("--seconds", type=float, default=25.0, help="diagnose duration per case")
    p.add_argument("--startup-s", type=float, default=120.0, help="wait for each workload")
    p.add_argument("--cases", default=",".join(c.name for c in cases.CASES))
    p.add_argument("--serve-s", type=float, default=30.0, help="latency: serving before the spin")
    p.add_argument("--no-rss", action="store_true", help="skip the RSS-above-floor figure")
    p.add_argument("--watchdog", default="", help="watchdog command (default: python -m watchdog)")
    p.add_argument("--rehearse", metavar="DIR", help="CPU stand-ins + recorded NVML answers")
    args = p.parse_args(argv)
    args.cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in args.cases if c not in cases.BY_NAME]
    if unknown:
        p.error(f"unknown case {unknown[0]!r}; cases: {', '.join(cases.BY_NAME)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not args.rehearse:
        reason = no_gpu_reason()
        if reason is not None:
            print(f"gpu_live: no NVIDIA GPU here ({reason}); checked nothing, exit 0")
            return 0
    args.out.mkdir(parents=True, exist_ok=True)
    procs = Procs()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, procs.interrupted)
    with tempfile.TemporaryDirectory(prefix="gpu-live-") as tmp:
        session = Session(args, Path(tmp), procs)
        try:
            oks = [session.run_case(c) for c in args.cases]
        except KeyboardInterrupt:
            print("gpu_live: interrupted; every child stopped, nothing judged", file=sys.stderr)
            return 130
        finally:
            procs.stop_all()
    print(cases.table(session.rows))
    (args.out / "gpu-live.json").write_text(json.dumps(session.results, indent=1, default=str))
    (args.out / "gpu-live.md").write_text(cases.table(session.rows) + "\n")
    if not args.no_rss:  # printed, not judged: RSS above what any NVML reader pays
        rss = measure_rss("nvml")
        print(f"gpu_live: {rss.line()}")
        (args.out / "rss.txt").write_text(rss.line() + "\n")
    mode = f"rehearsal with {args.rehearse}" if args.rehearse else "live NVML"
    print(f"gpu_live ({mode}): {sum(oks)}/{len(oks)} cases as expected; py-spy: "
          f"{session.pyspy or 'not found'}; results in {args.out}")  # fmt: skip
    return 0 if all(oks) else 1


if __name__ == "__main__":
    sys.exit(main())
