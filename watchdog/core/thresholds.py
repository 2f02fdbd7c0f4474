"""The numbers that change a verdict, in one place: every one comes from the config, is recorded
in the timeline's bundle, and is what `replay` uses again."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Thresholds:
    """The numbers classification depends on (all from the config)."""

    stall_after_s: float = 15.0
    suspect_after_s: float = 3.0
    proven_after_s: float = 6.0
    blind_stall_after_s: float = 120.0
    gpu_spin_sm: float = 0.9
    gpu_spin_dram: float = 0.05
    gpu_spin_for_s: float = 10.0
    gpu_busy_dram: float = 0.15
    gpu_spin_power_ratio: float = 0.3
    gpu_spin_clock_ratio: float = 0.5
    gpu_spin_power_max_ratio: float = 0.5
    gpu_spin_tensor: float = 0.1
    # A launcher still waiting for its shard this long after the load last showed progress
    # (core/state/events.py Heartbeat) is work that does not move: the same bound as the
    # weight_load operation's (core/knowledge/openops.toml), 30 minutes for 1.5 TB from network
    # storage.
    load_deadline_s: float = 1800.0
    # FlashInfer sleeps up to 20 s between download attempts (5/10/20 s, flashinfer
    # jit/cubin_loader.py v0.6.7): a CDN socket seen in this stall stays evidence this long
    # after it closed.
    socket_hold_s: float = 30.0
    # /health answers in a row that make its status evidence: one that flaps 200/503 is not a
    # dead engine.
    health_confirm: int = 3
    # A stats line's claim of pending work holds for this many stats intervals (learnt from
    # the lines' own timestamps) plus a slack for the log source's latency (a tick or two):
    # vLLM logs its stats every 10 s while it generates (vllm/v1/metrics/loggers.py).
    stats_due_factor: float = 1.5
    stats_due_slack_s: float = 2.0
    # SGLang logs its failed health check every few seconds while it lasts: one line stands
    # for this long (srt/entrypoints/http_server.py health_generate, SGLANG_HEALTH_CHECK_TIMEOUT
    # 20 s).
    not_generating_hold_s: float = 30.0
    # After a restart, lines before the new server's first startup line are the old server's
    # shutdown noise in a shared log file: dropped for at most this long (core/state/window.py).
    restart_echo_s: float = 10.0

    @classmethod
    def from_config(cls, cfg: object) -> Thresholds:
        """The fields of the same name from `cfg` (a watchdog.config.Config); core imports no
        config, so any object with these attributes will do."""
        return cls(**{k: getattr(cfg, k) for k in cls.__dataclass_fields__})


__all__ = ["Thresholds"]
