"""Hang episodes: take stacks when the server turns suspicious, write one incident per episode.

An episode opens on the first suspicious tick (no progress with work pending) or hang verdict
and closes once the server is healthy again for a few ticks or restarts under a new PID.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from watchdog.core.model import Observation, StackSample, Verdict
from watchdog.core.state.tick import Tick

log = logging.getLogger("hang_watchdog.episodes")

WRITE_RETRY_S = 15.0  # first retry of a failed bundle write; doubles up to the maximum
WRITE_RETRY_MAX_S = 300.0
# A server that keeps moving on while it is dumped (slow, not stuck) must not be dumped back to
# back: py-spy suspends the process it reads, so the dumps themselves would slow it further.
# The first discard retries at once; each later one waits twice as long, up to the maximum.
CAPTURE_BACKOFF_S = 5.0
CAPTURE_BACKOFF_MAX_S = 60.0
# A capture whose stacks proved nothing (a thread that moved between the dumps, a rank caught
# between two steps) is taken again while the stall lasts, so the verdict does not wait for
# the blind limit with one unlucky pair of dumps in hand; a few per episode, spaced out.
RECAPTURE_AFTER_S = 10.0
MAX_CAPTURES = 4
HEALTHY_STATES = frozenset({"serving", "idle", "loading", "compiling", "starting", "crawling"})


@dataclass
class Episode:
    """One stretch of trouble, from the first suspicious tick to recovery."""

    started_t: float
    started_wall: float
    capture_started_t: float | None = None
    incident: Path | None = None
    incident_signature: str | None = None
    healthy_ticks: int = 0
    write_failures: int = 0  # failed bundle writes this episode (a full or read-only disk)
    retry_write_t: float | None = None  # no new attempt before this time
    discarded_captures: int = 0  # captures the server moved on from while they ran
    capture_not_before: float | None = None  # back-off after repeated discards
    capture_done_t: float | None = None  # when the last capture's result came in
    captures: int = 0  # captures started this episode
    worst: str = ""  # "stalled" (soft) or "hung" (hard, cause proven): the furthest it got
    worst_signature: str | None = None

    def note(self, verdict: Verdict) -> None:
        """The furthest stage the episode reached: a proven hang over a soft stall."""
        if verdict.is_hang:
            self.worst, self.worst_signature = "hung", verdict.signature
        elif verdict.state == "stalled" and not self.worst:
            self.worst = "stalled"


class EpisodeHook:
    """Coordinates stack capture and the incident bundle for each episode."""

    def __init__(
        self,
        *,
        capturer: Any = None,
        writer: Any = None,
        log_tail: Callable[[], Sequence[str]] = lambda: (),
        environment: Callable[[Observation], dict[str, Any]] = lambda obs: {},
        metrics: Any = None,
        capture_wait_s: float = 30.0,
        stalled_incident_after_s: float = 60.0,
        close_after_ticks: int = 5,
    ) -> None:
        self.capturer, self.writer, self.metrics = capturer, writer, metrics
        self.log_tail, self.environment = log_tail, environment
        self.capture_wait_s = capture_wait_s
        self.stalled_incident_after_s = stalled_incident_after_s
        self.close_after_ticks = close_after_ticks
        self.episode: Episode | None = None
        self.capture: Any = None  # the CaptureResult of the current episode
        self.incidents: list[Path] = []
        self._checked_pid: int | None = None
        self.capture_warning: str | None = None  # why stack capture cannot work, said up front
        self._drop_native = False  # the next result is the native half of a discarded capture

    def on_tick(self, tick: Tick) -> None:
        obs, verdict = tick.obs, tick.verdict
        # Stacks collected now reach the window with the next observation: write the incident
        # then, so its verdict carries the stack evidence.
        fresh_stacks = self._collect_capture(tick)
        self._check_capture(obs)
        troubled = verdict.suspicious or verdict.is_hang or verdict.state == "stalled"
        if obs.procs is not None and obs.procs.restarted:
            if self.episode is not None:
                self._ended(
                    self.episode, "restarted", "the server came back under a new process", tick
                )
            self.episode = None
        if self.episode is None:
            if not troubled:
                return
            self.episode = Episode(started_t=obs.t, started_wall=obs.wall)
            self.capture = None
        ep = self.episode
        ep.note(verdict)
        if troubled:
            ep.healthy_ticks = 0
        elif verdict.state in HEALTHY_STATES:
            ep.healthy_ticks += 1
            if ep.healthy_ticks >= self.close_after_ticks:
                self.episode = None
                moved = f"the server moved on by itself ({verdict.state}: {verdict.reason})"
                self._ended(ep, "recovered_on_its_own", moved, tick)
                return
        progress_t = tick.window.progress.last_progress_t
        done, started = ep.capture_done_t, ep.capture_started_t
        if done is not None and started is not None and (progress_t or 0.0) > started:
            # The server moved on after these dumps (a slow first batch dumped, then the hang
            # began): they are no evidence of what comes next, so a new stall dumps afresh.
            self._discard(ep, obs.t, "the server made progress after it")
        if troubled:
            self._maybe_capture(obs, ep, verdict)
        if not fresh_stacks and self._wants_incident(obs, verdict, ep):
            self._write(tick, ep)

    # -- the evidence remediation waits for (remediation/collaborators.py Evidence) ---------
    def evidence_key(self) -> Hashable | None:
        """The current episode once its evidence is on disk; None while still waiting."""
        ep = self.episode
        if ep is None:
            return None
        if self.writer is not None:
            if ep.incident is not None and ep.incident_signature:
                return ep.incident
            if ep.write_failures:
                # The bundle cannot be written (disk full, read-only): waiting for it would
                # block every restart; the verdict on stderr is the evidence then.
                return ("episode", ep.started_t)
            return None
        if ep.capture_started_t is not None and self.capture is None:
            return None  # stacks still being taken
        return ("episode", ep.started_t)

    def incident(self) -> Path | None:
        """The current episode's bundle, once written."""
        return self.episode.incident if self.episode is not None else None

    def record_remediation(self, bundle: Path, record: dict[str, Any]) -> None:
        """Note in `bundle` what remediation did (best effort: the restart goes on)."""
        if self.writer is None:
            return
        try:
            self.writer.update_remediation(bundle, dict(record))
        except (OSError, ValueError) as exc:
            log.error("could not record the remediation in %s: %s", bundle, exc)

    def _ended(self, ep: Episode, outcome: str, detail: str, tick: Tick) -> None:
        """An episode that reached stalled or hung ended: count it, say it, note it in its
        bundle. A soft stall that ends by itself is common (real servers go silent and recover:
        syv-ai/qwen38-27b-rtx3090#107), so it is recorded, never remediated."""
        if not ep.worst:
            return  # only suspicious: nothing was reported, nothing to close
        if self.metrics is not None:
            self.metrics.episode(outcome)
        what = ep.worst_signature or ep.worst
        message = f"{what} episode ended: {outcome}; {detail}"
        tick.event(
            "episode", message, outcome=outcome, stage=ep.worst, signature=ep.worst_signature
        )
        if ep.incident is not None and self.writer is not None:
            try:
                self.writer.update_outcome(ep.incident, outcome, detail)
            except (OSError, ValueError) as exc:
                log.warning("could not record the outcome in %s: %s", ep.incident, exc)

    def _check_capture(self, obs: Observation) -> None:
        """Once per server process: say at once when py-spy will not be able to dump it
        (missing, no CAP_SYS_PTRACE, another PID namespace), not first during a hang."""
        pid = obs.procs.target_pid if obs.procs is not None and obs.procs.alive else None
        if self.capturer is None or pid is None or pid == self._checked_pid:
            return
        self._checked_pid = pid
        ok, why = self.capturer.check(pid)
        self.capture_warning = None if ok else why
        if not ok:
            log.warning("stack capture will not work for pid %d: %s", pid, why)

    def _collect_capture(self, tick: Tick) -> bool:
        if self.capturer is None:
            return False
        result = self.capturer.poll()
        if result is None:
            return False
        native_follows = self.capturer.native_pending()
        if self._drop_native:
            # The native dump of a capture whose Python dumps were discarded: just as stale.
            self._drop_native = native_follows
            return False
        if self.metrics is not None and not native_follows:
            self.metrics.stack_capture(result.result)  # once per capture: on its last result
        ep, now = self.episode, tick.obs.t
        moved = tick.window.progress.last_progress_t
        started = ep.capture_started_t if ep is not None else None
        if ep is not None and started is not None and moved is not None and moved > started:
            # Dumps begun before the server moved on show a moment it has left: not evidence
            # of this stall. Take new ones if it stalls again.
            self._drop_native = native_follows
            self._discard(ep, now, "the server made progress while it ran")
            return False
        self.capture = result
        if ep is not None and not native_follows:
            ep.capture_done_t = now
        samples = tuple(result.samples)
        if not samples and result.result != "ok":
            # Nothing was dumped (py-spy missing, no Python process): the verdict must still
            # say why its stack evidence is absent.
            samples = (StackSample(pid=0, title="stack capture", error=result.reason),)
        tick.attach_stacks(samples)
        log.info("stack capture finished: %s %s", result.result, result.reason)
        return True

    def _discard(self, ep: Episode, now: float, why: str) -> None:
        """Forget the episode's capture (its dumps show a moment the server has left); the next
        suspicious tick dumps again, at once the first time, then backing off."""
        ep.capture_started_t, ep.capture_done_t = None, None
        ep.discarded_captures += 1
        wait = 0.0
        if ep.discarded_captures > 1:
            wait = min(CAPTURE_BACKOFF_S * 2 ** (ep.discarded_captures - 2), CAPTURE_BACKOFF_MAX_S)
            ep.capture_not_before = now + wait
        log.info(
            "stack capture discarded: %s%s", why, f"; next capture in {wait:.0f} s" if wait else ""
        )

    def _maybe_capture(self, obs: Observation, ep: Episode, verdict: Verdict) -> None:
        if self.capturer is None:
            return
        if ep.capture_started_t is not None and not self._again(obs, ep, verdict):
            return
        if ep.capture_not_before is not None and obs.t < ep.capture_not_before:
            return
        if obs.procs is None or not obs.procs.alive or not obs.procs.procs:
            return
        if self.capturer.start(list(obs.procs.procs)):
            ep.capture_started_t, ep.capture_done_t = obs.t, None
            ep.captures += 1

    def _again(self, obs: Observation, ep: Episode, verdict: Verdict) -> bool:
        """Whether to dump again: the last capture is in, proved no cause, and the stall goes on."""
        if verdict.is_hang or ep.capture_done_t is None or ep.captures >= MAX_CAPTURES:
            return False
        return obs.t - ep.capture_done_t >= RECAPTURE_AFTER_S

    def _wants_incident(self, obs: Observation, verdict: Verdict, ep: Episode) -> bool:
        if self.writer is None:
            return False
        if verdict.is_hang:
            if ep.incident is not None and ep.incident_signature is not None:
                return False  # one incident per episode
        elif verdict.state == "stalled":
            if ep.incident is not None or obs.t - ep.started_t < self.stalled_incident_after_s:
                return False
        else:
            return False
        if ep.retry_write_t is not None and obs.t < ep.retry_write_t:
            return False  # the disk was full a moment ago: back off, do not retry every tick
        # The bundle waits for the native frames too (the verdict did not).
        native = self.capturer is not None and self.capturer.native_pending()
        waiting = ep.capture_started_t is not None and (self.capture is None or native)
        return not (waiting and obs.t - ep.capture_started_t < self.capture_wait_s)  # type: ignore[operator]

    def _write(self, tick: Tick, ep: Episode) -> None:
        from watchdog.outputs.incident import Incident

        obs, verdict = tick.obs, tick.verdict
        incident = Incident(
            verdict=verdict,
            # The lines of operations opened before the ring first: replay finds their leases.
            observations=[*tick.window.carried_observations(), *tick.window],
            capture=self.capture,
            log_tail=list(self.log_tail()),
            environment=self.environment(obs),
            started_wall=ep.started_wall,
        )
        try:
            path = self.writer.write(incident)
        except OSError as exc:
            ep.write_failures += 1
            delay = min(WRITE_RETRY_MAX_S, WRITE_RETRY_S * 2 ** (ep.write_failures - 1))
            ep.retry_write_t = obs.t + delay
            if ep.write_failures == 1 or ep.write_failures.bit_count() == 1:  # 1, 2, 4, 8...
                msg = (
                    f"could not write the incident bundle ({exc}); "
                    f"retrying in {delay:.0f} s, the verdict above is the evidence meanwhile"
                )
                log.error("%s", msg)
                tick.event("incident", msg)
            return
        ep.incident, ep.incident_signature = path, verdict.signature
        self.incidents.append(path)
        if self.metrics is not None:
            self.metrics.incident(verdict.signature or "stalled")
        tick.event("incident", f"wrote {path}", path=str(path), signature=verdict.signature)
