"""The workloads benchmarks/gpu_live.py judges, each a stand-in for a server in one state.

    python benchmarks/gpu_live_child.py MODE --log FILE --ready FILE [--cpu]

MODE: `spin` (a kernel that never returns, the host waiting in synchronize), `memcopy`
(device-to-device copies keep DRAM busy, no progress printed), `idle` (a CUDA context, no
work), `nccl` (two ranks; rank 0 waits in a barrier rank 1 never joins), `l2matmul` (bf16
matmuls 2048^3 back to back: operands stay in L2, so SM is high and DRAM ~0.03, a spin's
shape, while the tensor cores work near the power limit), `spinfull` (a kernel polling a
never-set volatile flag, 2 blocks x 1024 threads per SM), `latency` (serves matmuls with
progress in its stats lines for --serve-s, then launches the spinfull kernel and writes the
onset's Unix time to --ready + ".onset"). Each writes one vLLM
stats line to --log (the engine's own format, vllm/v1/metrics/loggers.py LoggingStatLogger:
`Running: 1 reqs` with zero throughput is work pending without progress; the idle one says
`Running: 0 reqs`) every 2 s, writes --ready (JSON: pid, what it launched, or the error that stopped
it) and blocks forever. `--cpu` swaps the GPU for plain waits in functions of the same names,
for rehearsing the script where no GPU exists (tests/test_gpu_live.py).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

# The spin: one block per SM loops on clock64() and reads the flag only every 2**20 cycles, so
# it moves (almost) no memory; the flag is never set. NVRTC compiles it at run time (CuPy's
# RawKernel), so no CUDA toolkit is needed beyond what the CuPy or PyTorch wheels bring.
SPIN_SOURCE = r"""
extern "C" __global__ void spin_forever(volatile int* flag, long long* out) {
    long long t = clock64();
    while (true) {
        long long start = clock64();
        while (clock64() - start < (1LL << 20)) { }
        t = clock64();
        if (flag[0] != 0) break;
    }
    if (threadIdx.x == 0) out[blockIdx.x] = t;
}
"""
# Full occupancy: every thread polls a volatile flag that is never set (2 blocks x 1024
# threads per SM); each poll is an L2 hit, so DRAM stays ~0 and SM reads 1.00.
POLL_SOURCE = r"""
extern "C" __global__ void poll_forever(volatile int* flag, int* out) {
    while (flag[0] == 0) { }
    out[blockIdx.x] = 1;
}
"""
# PyTorch-only fallback: a jiterator elementwise kernel that never leaves its loop.
JITERATOR_SPIN = """
template <typename T> T spin_forever(T x) {
    while (x == T(0)) { asm volatile("" ::: "memory"); x = x * T(clock64() < 0); }
    return x;
}
"""


def stats_line(running: int, gen_tps: float = 0.0) -> str:
    """One `Engine 000:` line as vLLM's LoggingStatLogger prints it (throughput zero unless
    given: a serving engine's line)."""
    stamp = time.strftime("%m-%d %H:%M:%S")
    return (
        f"(APIServer pid={os.getpid()}) INFO {stamp} [loggers.py:273] Engine 000: Avg prompt "
        f"throughput: 0.0 tokens/s, Avg generation throughput: {gen_tps:.1f} tokens/s, Running: "
        f"{running} reqs, Waiting: 0 reqs, GPU KV cache usage: 0.7%, Prefix cache hit rate: 0.0%"
    )


def allow_any_tracer() -> None:
    """Yama ptrace_scope 1 lets only ancestors attach; the watchdog is not ours, so say any."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(0x59616D61, ctypes.c_ulong(-1), 0, 0, 0)  # PR_SET_PTRACER, PR_SET_PTRACER_ANY
    except (OSError, AttributeError):
        pass


def announce(args: argparse.Namespace, running: int, **info: Any) -> None:
    """Start the stats lines, then say what was launched (the ready file)."""
    threading.Thread(target=keep_logging, args=(args.log, running), daemon=True).start()
    _ready(args, info)


def _ready(args: argparse.Namespace, info: dict[str, Any]) -> None:
    tmp = Path(args.ready + ".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "mode": args.mode, **info}))
    os.replace(tmp, args.ready)


def keep_logging(
    path: str, running: int, every_s: float = 2.0, progress: threading.Event | None = None
) -> None:
    """The stats line, again and again: vLLM's API server keeps printing it, with zero
    throughput, while the engine is stuck (vllm #48752), and the watchdog joins a log at its
    end, so a line written before it attached would never be read. While `progress` is set
    the line carries generation throughput (a serving engine)."""
    while True:
        tps = 850.0 if progress is not None and progress.is_set() else 0.0
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(stats_line(running, tps) + "\n")
        time.sleep(every_s)


def fail(args: argparse.Namespace, what: str, exc: BaseException) -> int:
    tmp = Path(args.ready + ".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "mode": args.mode, "error": f"{what}: {exc}"}))
    os.replace(tmp, args.ready)
    return 3


# -- the GPU workloads -------------------------------------------------------------------------


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def launch_spin() -> dict[str, Any]:
    """Start the never-returning kernel (CuPy, else PyTorch's jiterator); says what ran."""
    torch = _torch()
    if torch is not None:
        torch.zeros(1, device="cuda")  # one primary context for PyTorch and CuPy
    tried: list[str] = []
    try:
        import cupy

        sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
        kernel = cupy.RawKernel(SPIN_SOURCE, "spin_forever")
        flag, out = cupy.zeros(1, dtype=cupy.int32), cupy.zeros(sms, dtype=cupy.int64)
        kernel((sms,), (128,), (flag, out))
        return {"kernel": f"CuPy RawKernel, {sms} blocks x 128 threads", "sms": sms}
    except Exception as exc:  # ImportError, or NVRTC/CUDA errors: try PyTorch instead
        tried.append(f"CuPy: {exc}")
    if torch is None:
        raise RuntimeError("; ".join([*tried, "PyTorch: not importable or no CUDA"]))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    fn = torch.cuda.jiterator._create_jit_fn(JITERATOR_SPIN)
    fn(torch.zeros(sms * 1024, device="cuda"))
    return {"kernel": f"PyTorch jiterator, {sms * 1024} threads", "sms": sms, "tried": tried}


def launch_poll() -> dict[str, Any]:
    """Start the flag-polling kernel at full occupancy (CuPy)."""
    torch = _torch()
    if torch is not None:
        torch.zeros(1, device="cuda")  # one primary context for PyTorch and CuPy
    import cupy

    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    kernel = cupy.RawKernel(POLL_SOURCE, "poll_forever")
    flag, out = cupy.zeros(1, dtype=cupy.int32), cupy.zeros(2 * sms, dtype=cupy.int32)
    kernel((2 * sms,), (1024,), (flag, out))
    return {"kernel": f"CuPy RawKernel flag poll, {2 * sms} blocks x 1024 threads", "sms": sms}


def matmul_forever(size: int = 2048, until: float | None = None) -> None:
    """bf16 matmuls back to back (2048^3: operands stay in an H200's 60 MB L2), until `until`."""
    import torch

    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    while until is None or time.time() < until:
        for _ in range(50):
            a @ b
        torch.cuda.synchronize()


def serve_then_spin(args: argparse.Namespace) -> None:
    """Serve (matmuls, stats lines with throughput) for --serve-s, then spin; the onset's time
    goes to READY.onset, written just before the kernel launches."""
    progress = threading.Event()
    progress.set()
    threading.Thread(
        target=keep_logging, args=(args.log, 1, 5.0, progress), daemon=True
    ).start()  # every 5 s, as vLLM's default log_stats interval
    info = {"kernel": f"matmuls for {args.serve_s:.0f} s, then a flag-polling kernel"}
    _ready(args, info)
    if args.cpu:
        time.sleep(args.serve_s)
    else:
        matmul_forever(until=time.time() + args.serve_s)
    progress.clear()
    Path(args.ready + ".onset").write_text(f"{time.time():.3f}")
    if args.cpu:
        synchronize(cpu=True)
    launch_poll()
    wait_on_gpu()


def wait_on_gpu() -> None:
    """The host waits in synchronize, as an engine waits for its forward pass."""
    torch = _torch()
    while True:
        if torch is not None:
            torch.cuda.synchronize()
        else:
            synchronize()
        time.sleep(0.1)


def copy_forever() -> None:
    """Device-to-device copies, 256 MiB each, forever: DRAM busy, nothing printed."""
    torch = _torch()
    if torch is not None:
        src = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        while True:
            for _ in range(20):
                dst.copy_(src)
            torch.cuda.synchronize()
    import cupy

    src = cupy.empty(256 << 20, dtype=cupy.uint8)
    dst = cupy.empty_like(src)
    while True:
        for _ in range(20):
            dst[...] = src
        cupy.cuda.Device().synchronize()


def hold_context() -> str:
    torch = _torch()
    if torch is not None:
        torch.zeros(1, device="cuda")
        return "PyTorch"
    import cupy

    cupy.zeros(1)
    return "CuPy"


def nccl_rank(rank: int, port: int) -> None:
    """Rank 0 enters a barrier rank 1 never joins, after one all_reduce made the communicator."""
    import torch
    import torch.distributed as dist

    dev = rank % torch.cuda.device_count()
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    t = torch.ones(1, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    print(f"rank {rank} ready", flush=True)
    if rank == 0:
        time.sleep(1.0)
        dist.barrier(device_ids=[dev])
    while True:
        time.sleep(3600)


# -- the CPU rehearsal (same function names, no GPU) ------------------------------------------


def synchronize(cpu: bool = False) -> None:
    """Where the host waits when PyTorch is absent: cudaDeviceSynchronize through CuPy (whose
    own method is Cython, not a frame py-spy shows), or forever in the CPU rehearsal."""
    if cpu:
        threading.Event().wait()
    import cupy

    cupy.cuda.runtime.deviceSynchronize()


def idle_forever() -> None:
    while True:
        time.sleep(3600)


MODES = ("spin", "memcopy", "idle", "nccl", "l2matmul", "spinfull", "latency")

# -- modes --------------------------------------------------------------------------------------


def run_gpu(args: argparse.Namespace) -> int:
    try:
        if args.mode == "spin":
            info = launch_spin()
            announce(args, 1, **info)
            wait_on_gpu()
        elif args.mode == "memcopy":
            announce(args, 1, kernel="device-to-device copy, 256 MiB x 20 per sync")
            copy_forever()
        elif args.mode == "idle":
            announce(args, 0, kernel=f"{hold_context()} context, no work")
            idle_forever()
        elif args.mode == "l2matmul":
            announce(args, 1, kernel="bf16 matmul 2048^3 back to back (operands in L2)")
            matmul_forever()
        elif args.mode == "spinfull":
            info = launch_poll()
            announce(args, 1, **info)
            wait_on_gpu()
        elif args.mode == "latency":
            serve_then_spin(args)
    except Exception as exc:  # whatever CUDA, CuPy or PyTorch raised: reported as the reason
        return fail(args, f"{args.mode} could not start", exc)
    return 0


def run_nccl(args: argparse.Namespace, startup_s: float = 90.0) -> int:
    """Two ranks as children of this process (the "server"); reports when both are up."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    me = [sys.executable, os.path.abspath(__file__), "nccl-rank", "--log", args.log]
    ranks = [
        subprocess.Popen(
            [*me, "--ready", args.ready, "--rank", str(r), "--port", str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in (0, 1)
    ]
    lines: list[list[str]] = [[], []]
    readers = [
        threading.Thread(target=_collect, args=(proc, lines[i]), daemon=True)
        for i, proc in enumerate(ranks)
    ]
    for t in readers:
        t.start()
    deadline = time.monotonic() + startup_s
    while not all(any("ready" in x for x in out) for out in lines):
        exited = [p.returncode for p in ranks if p.poll() is not None]
        if exited or time.monotonic() > deadline:
            for p in ranks:
                p.kill()
            said = [x for out in lines for x in out if "NCCL" in x or "Error" in x]
            why = "; ".join(said)[-400:] or (
                f"a rank exited with {exited[0]}" if exited else f"not up in {startup_s:.0f} s"
            )
            return fail(args, "NCCL refused", RuntimeError(why))
        time.sleep(0.2)
    announce(args, 1, kernel="NCCL barrier on rank 0, rank 1 never joins", ranks=2)
    for proc in ranks:
        proc.wait()
    return 0


def _collect(proc: subprocess.Popen[str], into: list[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        into.append(line.strip())


def run_cpu(args: argparse.Namespace) -> int:
    if args.mode == "latency":
        serve_then_spin(args)  # blocks in synchronize() once "spinning"
        return 0
    if args.mode in ("spin", "spinfull"):
        announce(args, 1, kernel="CPU rehearsal: host waits in synchronize()")
        synchronize(cpu=True)
    elif args.mode in ("memcopy", "l2matmul"):
        announce(args, 1, kernel="CPU rehearsal: no GPU work")
        idle_forever()
    else:
        announce(args, 0, kernel="CPU rehearsal: no GPU work")
        idle_forever()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=(*MODES, "nccl-rank"))
    p.add_argument("--serve-s", type=float, default=30.0, help="latency: serve this long first")
    p.add_argument("--log", required=True)
    p.add_argument("--ready", required=True)
    p.add_argument("--cpu", action="store_true", help="rehearse without a GPU")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    allow_any_tracer()
    if args.cpu:
        return run_cpu(args)
    if args.mode == "nccl-rank":
        nccl_rank(args.rank, args.port)
        return 0
    if args.mode == "nccl":
        return run_nccl(args)
    return run_gpu(args)


if __name__ == "__main__":
    sys.exit(main())
