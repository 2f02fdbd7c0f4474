"""The workloads benchmarks/gpu_live.py judges, each a stand-in for a server in one state.

    python benchmarks/gpu_live_child.py MODE --log FILE --ready FILE [--cpu]

MODE: `spin` (a kernel that never returns, the host waiting in synchronize), `memcopy`
(device-to-device copies keep DRAM busy, no progress printed), `idle` (a CUDA context, no
work), `nccl` (two ranks; rank 0 waits in a barrier rank 1 never joins). Each writes one vLLM
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
# PyTorch-only fallback: a jiterator elementwise kernel that never leaves its loop.
JITERATOR_SPIN = """
template <typename T> T spin_forever(T x) {
    while (x == T(0)) { asm volatile("" ::: "memory"); x = x * T(clock64() < 0); }
    return x;
}
"""


def stats_line(running: int) -> str:
    """One `Engine 000:` line as vLLM's LoggingStatLogger prints it, throughput zero."""
    stamp = time.strftime("%m-%d %H:%M:%S")
    return (
        f"(APIServer pid={os.getpid()}) INFO {stamp} [loggers.py:273] Engine 000: Avg prompt "
        f"throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: "
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
    tmp = Path(args.ready + ".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "mode": args.mode, **info}))
    os.replace(tmp, args.ready)


def keep_logging(path: str, running: int, every_s: float = 2.0) -> None:
    """The stats line, again and again: vLLM's API server keeps printing it, with zero
    throughput, while the engine is stuck (vllm #48752), and the watchdog joins a log at its
    end, so a line written before it attached would never be read."""
    while True:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(stats_line(running) + "\n")
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
    if args.mode == "spin":
        announce(args, 1, kernel="CPU rehearsal: host waits in synchronize()")
        synchronize(cpu=True)
    elif args.mode == "memcopy":
        announce(args, 1, kernel="CPU rehearsal: no GPU work")
        idle_forever()
    else:
        announce(args, 0, kernel="CPU rehearsal: no GPU work")
        idle_forever()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("spin", "memcopy", "idle", "nccl", "nccl-rank"))
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
