#!/usr/bin/env bash
# Build, on a connected machine, the wheels benchmarks/gpu_live.py needs on an offline GPU
# machine that already has nvidia-ml-py, psutil, prometheus-client, httpx, PyTorch/CuPy and the
# driver: hang-watchdog (this tree) and py-spy. Usage: benchmarks/gpu_live_wheels.sh [DIR]
# (default: wheels/, ignored by git). Then, on the GPU machine, from the repository root:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/gl wheels/*.whl && PATH=/tmp/gl/bin:$PATH PYTHONPATH=/tmp/gl python3 benchmarks/gpu_live.py --out "${OUT:-gpu-live-out}"
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-wheels}"
limit_kib=$((32 * 1024)) # well under the 64 MiB a device run may carry
rm -rf "$dir"
mkdir -p "$dir"
python3 -m pip wheel --quiet --no-deps -w "$dir" . py-spy
total_kib=$(du -sk "$dir" | cut -f1)
ls -l "$dir"
if [ "$total_kib" -gt "$limit_kib" ]; then
    echo "gpu_live_wheels: $dir holds ${total_kib} KiB, over ${limit_kib} KiB" >&2
    exit 1
fi
echo "gpu_live_wheels: ${total_kib} KiB in $dir"
