"""`hang-watchdog preflight`: fail in seconds, before a multi-terabyte load, with the fix.

Run it as systemd `ExecStartPre=` or a Kubernetes initContainer. Exit 0 when nothing failed,
1 when a check failed (or warned, with --strict), 2 on usage errors.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from watchdog.preflight.report import exit_code as _exit_code
from watchdog.preflight.report import render_table, to_json
from watchdog.preflight.runner import PreflightOptions, load_shipped, run_checks
from watchdog.sources.gpu.backend import GpuBackend

__all__ = ["add_arguments", "main", "options_from_args", "run", "run_checks", "PreflightOptions"]


class UsageError(ValueError):
    """A flag's value is unusable; the message names the flag."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the preflight flags on `parser` (the CLI's subcommand or main()'s own)."""
    parser.add_argument(
        "--python",
        metavar="PATH",
        help="the server's Python interpreter (default: `python` on PATH)",
    )
    parser.add_argument(
        "--server-args",
        metavar="ARGS",
        default="",
        help="the server's arguments as one shell-split string; write it with '=' because it "
        'starts with a dash: --server-args="--attention-config.use_trtllm_attention=0"',
    )
    parser.add_argument("--json", action="store_true", help="print the stable JSON schema")
    parser.add_argument("--strict", action="store_true", help="warnings fail too (exit 1)")
    parser.add_argument(
        "--cdn-url",
        metavar="URL",
        help="cubin repository to probe "
        "(default: $FLASHINFER_CUBINS_REPOSITORY or FlashInfer's default)",
    )
    parser.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=float,
        default=3.0,
        help="deadline for each probe, at most 60 (default: 3)",
    )
    parser.add_argument(
        "--incident-dir", metavar="DIR", help="where incident bundles go (checks free space)"
    )
    parser.add_argument(
        "--pyspy",
        metavar="PATH",
        help="the py-spy the watchdog is configured with (its `pyspy` key; default: the "
        "watchdog's lookup, beside its Python and then on PATH)",
    )
    parser.add_argument(
        "--engine",
        choices=("vllm", "sglang", "trtllm"),
        default="vllm",
        help="the server's engine: its package and attention-backend arguments are checked "
        "(sglang: --attention-backend and the cubin path it would take)",
    )
    parser.add_argument(
        "--gpu-source",
        choices=("nvml", "none"),
        default="nvml",
        help="where GPU facts come from; none skips the GPU checks (default: nvml)",
    )


def options_from_args(args: argparse.Namespace) -> PreflightOptions:
    """Validate the parsed flags; raise UsageError naming the bad flag."""
    try:
        server_args = tuple(shlex.split(args.server_args or ""))
    except ValueError as e:
        raise UsageError(f"--server-args: cannot split {args.server_args!r}: {e}") from e
    if not args.timeout > 0 or args.timeout > 60:
        raise UsageError(
            f"--timeout must be more than 0 and at most 60 seconds, got {args.timeout:g}; "
            "e.g. --timeout 3"
        )
    if args.python is not None and not args.python.strip():
        raise UsageError("--python: empty path; give the server's interpreter")
    return PreflightOptions(
        environ=dict(os.environ),
        python=args.python,
        server_args=server_args,
        cdn_url=args.cdn_url,
        timeout_s=args.timeout,
        incident_dir=Path(args.incident_dir) if args.incident_dir else None,
        gpu_source=args.gpu_source,
        pyspy=args.pyspy or None,
        engine=getattr(args, "engine", "vllm") or "vllm",
    )


def _backend(source: str) -> GpuBackend | None:
    """The real NVML backend, imported only when asked for (it loads pynvml)."""
    if source == "none":
        return None
    from watchdog.sources.gpu.nvml import NvmlBackend

    return NvmlBackend()


def run(
    args: argparse.Namespace,
    *,
    backend: GpuBackend | None = None,
    options: PreflightOptions | None = None,
    out: TextIO | None = None,
) -> int:
    """Run preflight for parsed `args`; tests pass a fake `backend` and adjusted `options`."""
    stream = out or sys.stdout
    try:
        opts = options or options_from_args(args)
    except UsageError as e:
        print(f"hang-watchdog preflight: {e}", file=sys.stderr)
        return 2
    gpu = backend if backend is not None else _backend(opts.gpu_source)
    started = time.monotonic()
    knowledge, why = load_shipped()  # once: signatures' known-bad entries, engine profiles
    results = run_checks(opts, gpu, knowledge, why)
    elapsed = time.monotonic() - started
    if args.json:
        print(to_json(results, strict=args.strict, elapsed_s=elapsed), file=stream)
    else:
        print(render_table(results, strict=args.strict), file=stream)
    return _exit_code(results, strict=args.strict)


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point: `python -c "...; sys.exit(main(sys.argv[1:]))"`."""
    parser = argparse.ArgumentParser(prog="hang-watchdog preflight", description=__doc__)
    add_arguments(parser)
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as e:
        return int(e.code or 0)
    return run(args)
