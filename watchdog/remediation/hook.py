"""The remediation hook: on a confident hang, after the evidence is on disk, restart the server
with the signature's fallback, bounded by a cooldown and a cap, then verify it recovered.

Blocking work (stop grace, systemctl, the smoke test) runs in background threads; each tick
only looks at how they are doing, so the daemon loop never waits on them. What to do is
decide.py's pure rule chain; where a restart stands is machine.py's state machine.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Hashable

from watchdog.core.knowledge.signatures import SignatureSet
from watchdog.core.state.tick import Tick
from watchdog.engines.loader import EngineSet
from watchdog.engines.profile import EngineProfile
from watchdog.remediation.collaborators import Evidence, NoMetrics, RemediationMetrics
from watchdog.remediation.decide import UNASKED, Decision, Facts, Kind, decide
from watchdog.remediation.deployment import FleetDecider, fleet_block
from watchdog.remediation.kept import KeptState
from watchdog.remediation.limits import SteadyWall, gate
from watchdog.remediation.machine import Attempt, Machine, Phase
from watchdog.remediation.plan import Plan, PlanError, make_plan
from watchdog.remediation.restarters import Restarter, RestartJob
from watchdog.remediation.settings import RemediationConfig
from watchdog.remediation.state import RemediationState, StateStore
from watchdog.remediation.verify import Outcome, SmokeTest, Verifier

log = logging.getLogger("hang_watchdog.remediation")


class RemediationHook:
    """Decides, acts, verifies and records; state persists in `store` across watchdog restarts."""

    def __init__(
        self,
        cfg: RemediationConfig,
        sigs: SignatureSet,
        *,
        restarter: Restarter,
        store: StateStore,
        episodes: Evidence,
        metrics: RemediationMetrics | None = None,
        wall: Callable[[], float] | None = None,
        engines: EngineSet | None = None,
        fleet: FleetDecider | None = None,
    ) -> None:
        self.cfg, self.sigs, self.restarter = cfg, sigs, restarter
        self.episodes = episodes
        self.metrics: RemediationMetrics = metrics if metrics is not None else NoMetrics()
        # The profiles the tick's engine in force is looked up in: whose spelling of each
        # fallback (none: the shipped spelling).
        self.engines = engines
        self.fleet = fleet  # cause mode of a deployment (remediation/deployment.py)
        self.wall = wall or SteadyWall()
        self.kept = KeptState(store, self.wall)
        self.machine = Machine()
        self._handled: Hashable | None = None  # the episode decided for good
        self._said: set[tuple[Hashable | None, str]] = set()  # (episode, reason) already said
        self._export_state()

    @property
    def state(self) -> RemediationState:
        """The persisted counters and active fallback (replaced when the file is reloaded)."""
        return self.kept.state

    @property
    def restarting(self) -> bool:
        """A restart job is running: the server it stops is meant to exit."""
        return self.machine.phase is Phase.RESTARTING

    # -- per tick ---------------------------------------------------------------------------
    def on_tick(self, tick: Tick) -> None:
        if self.kept.reload_if_changed():  # an operator may `fallback clear` while it runs
            self._export_state()
        if self.machine.phase is Phase.RESTARTING:
            self._poll_job(tick)
            return
        if self.machine.phase is Phase.VERIFYING:
            verifier = self.machine.attempt.verifier
            assert verifier is not None
            outcome = verifier.step(tick.obs, tick.verdict, tick.window.progress)
            if outcome is None:
                return
            self._finish(outcome, tick)
        if tick.verdict.is_hang:
            self._consider(tick)

    def _consider(self, tick: Tick) -> None:
        key = self.episodes.evidence_key()
        facts = self._facts(tick, key)
        decision = decide(facts)
        if decision.kind is Kind.ASK_FLEET:
            fleet = fleet_block(self.cfg, tick.verdict, self.fleet)
            decision = decide(dataclasses.replace(facts, fleet=fleet))
        if decision.handled:
            self._handled = key
        plan = facts.plan
        if decision.exhausts:
            self._exhaust(decision, plan, tick)
        if decision.kind is Kind.SKIP:
            self._skip(tick, key, decision)
        elif decision.kind is Kind.DRY_RUN:
            assert plan is not None
            self._dry_run(plan, tick)
        elif decision.kind is Kind.RESTART:
            assert plan is not None
            refused = self._act(plan, tick)
            if refused:
                failed = Decision(
                    Kind.SKIP, why=refused, action=plan.action, outcome="failed", rule="state"
                )
                self._skip(tick, key, failed)
            else:
                self._handled = key

    def _engine(self, tick: Tick) -> EngineProfile | None:
        """The profile of the tick's engine in force; None while none is recognised."""
        return self.engines.get(tick.engine) if self.engines is not None else None

    def _facts(self, tick: Tick, key: Hashable | None) -> Facts:
        """What decide() needs; the limits are checked against the steady wall clock."""
        cfg, verdict = self.cfg, tick.verdict
        plan: Plan | None = None
        error = ""
        try:
            plan = make_plan(verdict, self.sigs, tick.window.progress.facts,
                             cfg.fallback_overrides, self.state.active,
                             engine=self._engine(tick))  # fmt: skip
        except PlanError as exc:
            error = str(exc)
        limits = gate(self.state, self.wall(), cooldown_s=cfg.cooldown_s,
                      window_s=cfg.restart_window_s, max_restarts=cfg.max_restarts)  # fmt: skip
        return Facts(
            episode=key,
            handled=self._handled,
            plan=plan,
            plan_error=error,
            fix=verdict.fix or "",
            confidence=verdict.confidence,
            min_confidence=cfg.remediate_min_confidence,
            fleet=None if not cfg.deployment else UNASKED,
            dry_run=cfg.dry_run,
            limits=limits,
        )

    def _exhaust(self, decision: Decision, plan: Plan | None, tick: Tick) -> None:
        """The cap was reached: latch it in the state (only an operator clears it)."""
        self.state.exhausted, self.state.exhausted_reason = True, decision.exhausts
        self.kept.save()
        self._export_state()
        tick.event(
            "remediation_exhausted",
            f"{decision.exhausts}: no more restarts until an operator runs "
            "`hang-watchdog fallback clear`",
            signature=plan.signature if plan is not None else None,
        )

    def _dry_run(self, plan: Plan, tick: Tick) -> None:
        self.metrics.remediation(plan.action, "planned")
        self.metrics.set_plan(plan.to_dict(), dry_run=True)
        tick.event(
            "remediation",
            f"dry run: would {plan.describe()} via {self.restarter.name}",
            outcome="planned",
            plan=plan.to_dict(),
            restarter=self.restarter.name,
        )
        bundle = self.episodes.incident()
        if bundle is not None:
            record = {"dry_run": True, "restarter": self.restarter.name, "plan": plan.to_dict()}
            self.episodes.record_remediation(bundle, {**record, "outcome": "planned"})

    def _act(self, plan: Plan, tick: Tick) -> str:
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
        self.state.fallback_file = self.restarter.env_file or before[2]
        failed = self.kept.save()
        if failed:
            self.state.restarts, self.state.active, self.state.fallback_file = before
            return (
                f"not restarting: {failed}; make {self.kept.store.dir} writable by the watchdog "
                "(or set state_dir to a directory that is)"
            )
        self._export_state(started=1)
        self.metrics.set_plan(plan.to_dict(), dry_run=False)
        record = {
            "dry_run": False,
            "restarter": self.restarter.name,
            "plan": plan.to_dict(),
            "started_wall": now,
            "outcome": "restarting",
        }
        obs = tick.obs
        pid = obs.procs.target_pid if obs.procs is not None else None
        job = RestartJob(self.restarter, plan, pid)
        attempt = Attempt(plan=plan, job=job, bundle=self.episodes.incident(), record=record)
        self.machine.begin(attempt)
        self._record(attempt)
        tick.event(
            "remediation",
            f"{plan.describe()} via {self.restarter.name}",
            outcome="restarting",
            plan=plan.to_dict(),
        )
        job.start()  # the bundle and the operator hear of it before the server is stopped
        return ""

    def _poll_job(self, tick: Tick) -> None:
        attempt = self.machine.attempt
        job = attempt.job
        if job.thread.is_alive():
            return
        if job.error is not None or job.result is None:
            why = job.error or f"the {self.restarter.name} restarter reported nothing"
            self._finish(Outcome("failed", f"restart failed: {why}"), tick)
            return
        attempt.record["restart"] = job.result
        tick.event(
            "remediation", f"restarted: {job.result}; verifying recovery", outcome="verifying"
        )
        smoke = None
        if self.cfg.server_url and self.cfg.smoke_test:
            smoke = SmokeTest(self.cfg.server_url, timeout_s=min(30.0, self.cfg.recover_within_s))
        spin = tick.thresholds.gpu_spin_dram
        self.machine.verify(
            Verifier(tick.obs.t, self.cfg.recover_within_s, spin_dram=spin, smoke=smoke)
        )

    def _finish(self, outcome: Outcome, tick: Tick) -> None:
        attempt = self.machine.end()
        plan = attempt.plan
        self.metrics.remediation(plan.action, outcome.outcome)
        attempt.record.update(
            {
                "outcome": outcome.outcome,
                "reason": outcome.reason,
                "verification": outcome.details,
                "finished_wall": self.wall(),
            }
        )
        self._record(attempt)
        self.state.record(
            {
                "signature": plan.signature,
                "fallback": plan.fallback,
                "outcome": outcome.outcome,
                "reason": outcome.reason,
                "wall": self.wall(),
            }
        )
        self.kept.save()
        tick.event(
            "remediation",
            f"{outcome.outcome}: {outcome.reason}",
            outcome=outcome.outcome,
            signature=plan.signature,
            fallback=plan.fallback,
        )

    # -- helpers ----------------------------------------------------------------------------
    def _record(self, attempt: Attempt) -> None:
        if attempt.bundle is not None:
            self.episodes.record_remediation(attempt.bundle, dict(attempt.record))

    def _skip(self, tick: Tick, key: Hashable | None, decision: Decision) -> None:
        """Report why no restart happens, once per episode and reason (or rule: a cooldown's
        text counts down, yet it is said once)."""
        said = (key, decision.rule or decision.why)
        if said in self._said:
            return
        self._said.add(said)
        self.metrics.remediation(decision.action, decision.outcome)
        tick.event("remediation", decision.why, outcome=decision.outcome)

    def _export_state(self, started: int = 0) -> None:
        self.metrics.set_remediation_exhausted(self.state.exhausted)
        self.metrics.set_restarts(max(self.state.restarts, default=None), started)
        active = set((self.state.active or {}).get("fallbacks") or [])
        for name in self.sigs.fallbacks:
            self.metrics.set_fallback_active(name, name in active)

    def close(self) -> None:
        """At shutdown, let a restart in flight finish (the supervisor refuses a new start
        once closing), so no server is left running unwatched."""
        if self.machine.phase is Phase.RESTARTING:
            self.machine.attempt.job.thread.join(timeout=self.cfg.stop_grace_s + 15.0)
