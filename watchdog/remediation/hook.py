"""The remediation hook: on a confident hang, after the evidence is on disk, restart the server
with the signature's fallback, bounded by a cooldown and a cap, then verify it recovered.

Blocking work (stop grace, systemctl, the smoke test) runs in background threads; each tick
only looks at how they are doing, so the daemon loop never waits on them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from watchdog.config import Config
from watchdog.core.model import Observation, Verdict
from watchdog.core.signatures import SignatureSet
from watchdog.remediation.canary import CanaryHook
from watchdog.remediation.deployment import FleetDecider, fleet_block
from watchdog.remediation.limits import Gate, SteadyWall, clamp_future, gate
from watchdog.remediation.plan import Plan, PlanError, make_plan
from watchdog.remediation.restarters import Restarter, RestartJob
from watchdog.remediation.state import StateError, StateStore
from watchdog.remediation.verify import Outcome, SmokeTest, Verifier

log = logging.getLogger("hang_watchdog.remediation")


def _decider(cfg: Config) -> FleetDecider | None:
    """Cause mode of a deployment: the Prometheus-answer decider (remediation/deployment.py)."""
    if not cfg.deployment or cfg.fleet_remediation != "cause":
        return None
    from watchdog.outputs.fleet import FleetLabels

    return FleetDecider(cfg, FleetLabels.resolve(cfg.deployment, cfg.node).node)


class RemediationHook:
    """Decides, acts, verifies and records; state persists in `store` across watchdog restarts."""

    def __init__(
        self,
        cfg: Config,
        sigs: SignatureSet,
        *,
        restarter: Restarter,
        store: StateStore,
        metrics: Any = None,
        episodes: Any = None,
        busy: Callable[[bool], None] = lambda on: None,
        canary: CanaryHook | None = None,
        wall: Callable[[], float] | None = None,
        engine: Any = None,
        fleet: FleetDecider | None = None,
    ) -> None:
        self.engine = engine  # EngineRef: whose spelling of each fallback to use
        self.fleet = fleet if fleet is not None else _decider(cfg)
        self.cfg, self.sigs, self.restarter, self.store = cfg, sigs, restarter, store
        self.metrics, self.episodes, self.busy, self.canary, self.wall = (
            metrics,
            episodes,
            busy,
            canary,
            wall or SteadyWall(),
        )
        self.state = store.load()
        clamp_future(self.state, self.wall())
        self._mtime = self.store.stamp()
        self._save_error = ""
        self._handled: Any = None  # the episode already acted on
        self._said: set[tuple[Any, str]] = set()  # (episode, reason) skips already reported
        self._job: RestartJob | None = None
        self._verifier: Verifier | None = None
        self._plan: Plan | None = None
        self._record: dict[str, Any] = {}
        self._bundle: Path | None = None
        self._export_state()

    # -- per tick ---------------------------------------------------------------------------
    def on_tick(self, obs: Observation, verdict: Verdict, daemon: Any) -> None:
        if self.canary is not None:
            self.canary.on_tick(obs, verdict, daemon)
        self._reload_if_changed()
        if self._job is not None:
            self._poll_job(obs, daemon)
            return
        if self._verifier is not None:
            outcome = self._verifier.step(obs, verdict, daemon.window.progress)
            if outcome is None:
                return
            self._finish(outcome, daemon)
        if verdict.is_hang:
            self._consider(obs, verdict, daemon)

    def _consider(self, obs: Observation, verdict: Verdict, daemon: Any) -> None:
        key = self._episode_key()
        if key is None or key == self._handled:
            return
        try:
            plan = make_plan(
                verdict,
                self.sigs,
                daemon.window.progress.facts,
                self.cfg.fallback_overrides,
                self.state.active,
                engine=self.engine.profile if self.engine is not None else None,
            )
        except PlanError as exc:
            self._handled = key
            self._skip(daemon, key, "?", f"no plan: {exc}")
            return
        if plan is None:
            self._handled = key
            return
        if not plan.restart:
            self._handled = key
            self._skip(
                daemon, key, plan.action, f"{plan.describe()}: {verdict.fix or 'see the incident'}"
            )
            return
        if verdict.confidence < self.cfg.remediate_min_confidence:
            floor = self.cfg.remediate_min_confidence
            why = f"confidence {verdict.confidence:.2f} < remediate_min_confidence {floor:.2f}"
            self._skip(daemon, key, plan.action, f"not acting on {plan.signature}: {why}")
            return  # not handled: the confidence may still rise within this episode
        fleet = fleet_block(self.cfg, verdict, self.fleet)
        if fleet:
            self._skip(daemon, key, plan.action, f"not acting on {plan.signature}: {fleet}")
            return  # not handled: the stacks that name the cause rank may still arrive
        if self.cfg.dry_run:
            self._handled = key
            self._dry_run(plan, daemon)
            return
        # A cooldown ends and a failed save may be fixed: those episodes are reconsidered every
        # tick (reported once), else a server that hangs again soon after a restart stays hung.
        limits = self._limits(plan, daemon, key)
        if limits.blocked:
            self._skip(daemon, key, plan.action, limits.blocked, rule=limits.rule)
            return
        refused = self._act(plan, obs, daemon)
        if refused:
            self._skip(daemon, key, plan.action, refused, outcome="failed", rule="state")
            return
        self._handled = key

    def _limits(self, plan: Plan, daemon: Any, key: Any) -> Gate:
        """Whether the limits allow a restart now; latches exhaustion once (episode handled)."""
        cfg = self.cfg
        verdict = gate(
            self.state,
            self.wall(),
            cooldown_s=cfg.cooldown_s,
            window_s=cfg.restart_window_s,
            max_restarts=cfg.max_restarts,
        )
        if verdict.exhausts:
            self._handled = key
            self.state.exhausted, self.state.exhausted_reason = True, verdict.exhausts
            self._save()
            self._export_state()
            daemon.emitter.event(
                "remediation_exhausted",
                f"{verdict.exhausts}: no more restarts until an operator runs "
                "`hang-watchdog fallback clear`",
                signature=plan.signature,
            )
        return verdict

    def _dry_run(self, plan: Plan, daemon: Any) -> None:
        self._metric(plan.action, "planned")
        if self.metrics is not None:
            self.metrics.set_plan(plan.to_dict(), dry_run=True)
        daemon.emitter.event(
            "remediation",
            f"dry run: would {plan.describe()} via {self.restarter.name}",
            outcome="planned",
            plan=plan.to_dict(),
            restarter=self.restarter.name,
        )
        self._bundle = self._incident()
        self._update_bundle(
            {
                "dry_run": True,
                "restarter": self.restarter.name,
                "plan": plan.to_dict(),
                "outcome": "planned",
            }
        )

    def _act(self, plan: Plan, obs: Observation, daemon: Any) -> str:
        """Record the restart in the state, then start it ("" returned). Refused (the reason
        returned) when the state cannot be saved: a restart it forgets would escape the cap."""
        now = self.wall()
        before = (self.state.restarts, self.state.active, self.state.fallback_file)
        self.state.restarts = [*self.state.recent(now, self.cfg.restart_window_s), now]
        if plan.active:
            self.state.active = {
                "fallbacks": list(plan.active),
                "args": list(plan.args),
                "env": dict(plan.env),
                "since": now,
            }
        # `fallback clear` empties the file the server reads, even when not told its path
        self.state.fallback_file = getattr(self.restarter, "env_file", None) or before[2]
        failed = self._save()
        if failed:
            self.state.restarts, self.state.active, self.state.fallback_file = before
            return (
                f"not restarting: {failed}; make {self.store.dir} writable by the watchdog "
                "(or set state_dir to a directory that is)"
            )
        self._export_state(started=1)
        if self.metrics is not None:
            self.metrics.set_plan(plan.to_dict(), dry_run=False)
        self._plan, self._bundle = plan, self._incident()
        self._record = {
            "dry_run": False,
            "restarter": self.restarter.name,
            "plan": plan.to_dict(),
            "started_wall": now,
            "outcome": "restarting",
        }
        self._update_bundle(self._record)
        daemon.emitter.event(
            "remediation",
            f"{plan.describe()} via {self.restarter.name}",
            outcome="restarting",
            plan=plan.to_dict(),
        )
        pid = obs.procs.target_pid if obs.procs is not None else None
        self.busy(True)
        self._job = RestartJob(self.restarter, plan, pid, lambda: self.busy(False))
        return ""

    def _poll_job(self, obs: Observation, daemon: Any) -> None:
        job = self._job
        assert job is not None and self._plan is not None
        if job.thread.is_alive():
            return
        self._job = None
        if job.error is not None or job.result is None:
            why = job.error or f"the {self.restarter.name} restarter reported nothing"
            self._finish(Outcome("failed", f"restart failed: {why}"), daemon)
            return
        self._record["restart"] = job.result
        daemon.emitter.event(
            "remediation", f"restarted: {job.result}; verifying recovery", outcome="verifying"
        )
        smoke = None
        if self.cfg.server_url and self.cfg.smoke_test:
            smoke = SmokeTest(self.cfg.server_url, timeout_s=min(30.0, self.cfg.recover_within_s))
        self._verifier = Verifier(
            obs.t, self.cfg.recover_within_s, spin_dram=daemon.thresholds.gpu_spin_dram, smoke=smoke
        )

    def _finish(self, outcome: Outcome, daemon: Any) -> None:
        plan = self._plan
        assert plan is not None
        self._verifier = None
        self._metric(plan.action, outcome.outcome)
        self._record.update(
            {
                "outcome": outcome.outcome,
                "reason": outcome.reason,
                "verification": outcome.details,
                "finished_wall": self.wall(),
            }
        )
        self._update_bundle(self._record)
        self.state.record(
            {
                "signature": plan.signature,
                "fallback": plan.fallback,
                "outcome": outcome.outcome,
                "reason": outcome.reason,
                "wall": self.wall(),
            }
        )
        self._save()
        daemon.emitter.event(
            "remediation",
            f"{outcome.outcome}: {outcome.reason}",
            outcome=outcome.outcome,
            signature=plan.signature,
            fallback=plan.fallback,
        )

    # -- helpers ----------------------------------------------------------------------------
    def _episode_key(self) -> Any:
        """The current episode once its evidence is on disk; None while still waiting."""
        ep = getattr(self.episodes, "episode", None)
        if ep is None:
            return None
        if getattr(self.episodes, "writer", None) is not None:
            if ep.incident is not None and ep.incident_signature:
                return ep.incident
            if getattr(ep, "write_failures", 0):
                # The bundle cannot be written (disk full, read-only): waiting for it would
                # block every restart; the verdict on stderr is the evidence then.
                return ("episode", ep.started_t)
            return None
        if ep.capture_started_t is not None and self.episodes.capture is None:
            return None  # stacks still being taken
        return ("episode", ep.started_t)

    def _incident(self) -> Path | None:
        ep = getattr(self.episodes, "episode", None)
        return ep.incident if ep is not None else None

    def _update_bundle(self, record: dict[str, Any]) -> None:
        writer = getattr(self.episodes, "writer", None)
        if writer is None or self._bundle is None:
            return
        try:
            writer.update_remediation(self._bundle, dict(record))
        except (OSError, ValueError) as exc:
            log.error("could not record the remediation in %s: %s", self._bundle, exc)

    def _skip(
        self,
        daemon: Any,
        key: Any,
        action: str,
        why: str,
        outcome: str = "skipped",
        rule: str = "",
    ) -> None:
        """Report why no restart happens, once per episode and reason (or rule: a cooldown's
        text counts down, yet it is said once)."""
        if (key, rule or why) in self._said:
            return
        self._said.add((key, rule or why))
        self._metric(action, outcome)
        daemon.emitter.event("remediation", why, outcome=outcome)

    def _metric(self, action: str, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.remediation(action, outcome)

    def _export_state(self, started: int = 0) -> None:
        if self.metrics is None:
            return
        self.metrics.set_remediation_exhausted(self.state.exhausted)
        setter = getattr(self.metrics, "set_restarts", None)
        if setter is not None:
            setter(max(self.state.restarts, default=None), started)
        active = set((self.state.active or {}).get("fallbacks") or [])
        for name in self.sigs.fallbacks:
            self.metrics.set_fallback_active(name, name in active)

    def close(self) -> None:
        """At shutdown, let a restart in flight finish (the supervisor refuses a new start
        once closing), so no server is left running unwatched."""
        job = self._job
        if job is not None:
            job.thread.join(timeout=self.cfg.stop_grace_s + 15.0)

    def _reload_if_changed(self) -> None:
        """An operator may clear the file (`fallback clear`) while the watchdog runs."""
        mtime = self.store.stamp()
        if mtime == self._mtime:
            return
        self._mtime = mtime
        try:
            self.state = self.store.load()
            clamp_future(self.state, self.wall())
        except StateError as exc:
            log.error("remediation state: %s", exc)
            return
        self._export_state()

    def _save(self) -> str:
        """Persist the state; why it failed ("" when saved)."""
        failed = ""
        try:
            self.store.save(self.state)
        except OSError as exc:
            failed = f"cannot save the remediation state to {self.store.path}: {exc}"
            if failed != self._save_error:  # retried every tick: say each failure once
                log.error("%s", failed)
        self._save_error = failed
        self._mtime = self.store.stamp()
        return failed
