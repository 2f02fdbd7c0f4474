"""Which GPUs belong to the watched server (pure).

A node often holds more GPUs than one server uses: a Kubernetes sidecar with
`NVIDIA_VISIBLE_DEVICES=all` or a shared systemd host sees all of them, and one busy GPU of
another server must neither hide this server's stall nor lend it a spin. In order:

1. the operator's `gpus` setting (indices or UUIDs);
2. GPU UUIDs in the server's `NVIDIA_VISIBLE_DEVICES` or `CUDA_VISIBLE_DEVICES` (the NVIDIA
   device plugin sets UUIDs, and they are the same in every container on the node);
3. GPUs whose compute processes are in the server's process tree (NVML reports host PIDs, so
   this works where the watchdog shares the host's PID namespace);
4. indices in `CUDA_VISIBLE_DEVICES`, trusted only outside containers: inside one the server
   counts from 0 over its own GPUs (CUDA also orders devices fastest-first unless
   `CUDA_DEVICE_ORDER=PCI_BUS_ID`, which NVML's order matches);
5. every GPU, when nothing above names one that exists.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence

from watchdog.core.model import GpuSample

_ENV_KEYS = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def _items(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def _pick(gpus: Sequence[GpuSample], wanted: Collection[str]) -> tuple[GpuSample, ...]:
    return tuple(g for g in gpus if str(g.index) in wanted or (g.uuid or "") in wanted)


def server_gpus(
    gpus: Sequence[GpuSample],
    *,
    configured: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    tree_pids: Collection[int] = (),
    same_pid_namespace: bool = True,
) -> tuple[tuple[GpuSample, ...], str]:
    """The server's GPUs and how they were chosen (for the timeline and the logs)."""
    if configured:
        return _pick(gpus, {v for c in configured for v in _items(c)}), "configured"
    env = environ or {}
    for key in _ENV_KEYS:
        uuids = {v for v in _items(env.get(key)) if v.startswith(("GPU-", "MIG-"))}
        picked = _pick(gpus, uuids)
        if picked:
            return picked, f"{key} UUIDs"
    if tree_pids and same_pid_namespace:
        picked = tuple(g for g in gpus if set(g.pids) & set(tree_pids))
        if picked:
            return picked, "server processes"
    if same_pid_namespace:
        indices = {v for v in _items(env.get("CUDA_VISIBLE_DEVICES")) if v.isdigit()}
        picked = _pick(gpus, indices)
        if picked:
            return picked, "CUDA_VISIBLE_DEVICES indices"
    return tuple(gpus), "all"


def in_container(root: str = "/") -> bool:
    """Docker, Podman or Kubernetes: NVML's host PIDs then mean nothing in our PID namespace."""
    markers = (".dockerenv", "run/.containerenv", "var/run/secrets/kubernetes.io")
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) or any(
        os.path.exists(os.path.join(root, m)) for m in markers
    )
