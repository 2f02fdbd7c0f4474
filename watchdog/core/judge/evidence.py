"""How each evidence kind of the signature data is checked against a window (pure).

Each evaluator returns a human-readable detail when its rule holds, or None.
"""

from __future__ import annotations

from collections.abc import Iterable

from watchdog.core.judge.context import Context
from watchdog.core.judge.generic import after_progress
from watchdog.core.judge.spinsignals import describe, host_cpu, spin_by
from watchdog.core.knowledge.signatures import Rule
from watchdog.core.model import Frame, LogEvent, Observation, StackSample

UNCHANGED = ", unchanged across two dumps"  # in a stack rule's detail: the thread did not move
HELD = ", in that frame in both dumps"  # it moved within the frame, never out of it (retries)


def _log(rule: Rule, ctx: Context) -> str | None:
    assert rule.pattern is not None
    # Every tick searches the rule's whole lookback: the rule remembers each line's answer.
    seen, match = rule.line_answers, rule.matches_line
    if rule.after_progress:
        lines = [ev.line for ev in _after_progress(ctx, rule.within_s)]
    else:
        lines = [ev.line for o in ctx.recent(rule.within_s) for ev in o.logs]
    hits = [line for line in lines if (seen[line] if line in seen else match(line))]
    hits += [line for line in ctx.derived_lines if rule.pattern.search(line)]
    if not hits:
        return None
    more = f" (and {len(hits) - 1} more)" if len(hits) > 1 else ""
    return f"{_shorten(hits[-1])!r}{more}"


def _after_progress(ctx: Context, within_s: float) -> list[LogEvent]:
    """The window's log events after the server's last progress (core/state/events.py), read as
    the generic layer reads them, so live and `replay` agree on a death the server survived."""
    since = ctx.window.progress.last_progress_t
    recent = [ev for o in ctx.recent(within_s) if since is None or o.t >= since for ev in o.logs]
    return after_progress(recent)


def _shorten(line: str, limit: int = 300) -> str:
    """Keep both ends of a long line: a FlashInfer URL must not hide 'attempt 3 failed'."""
    if len(line) <= limit:
        return line
    half = (limit - 3) // 2
    return f"{line[:half]} … {line[-half:]}"


def short_title(title: str, limit: int = 60) -> str:
    """A process title cut at a word boundary, marked with '…': never `watchdog.sim.vll`."""
    exe, sep, rest = title.partition(" ")
    if "/" in exe:  # `/root/.pyenv/versions/3.11.7/bin/python3 -m x`: the path says little
        title = exe.rsplit("/", 1)[-1] + sep + rest
    if len(title) <= limit:
        return title
    cut = title[: limit - 1].rstrip()
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip() + " …"


def _by_name(rule: Rule, fr: Frame) -> bool:
    # py-spy 0.4 on Python >= 3.11 prints qualified names (`MessageQueue.dequeue`,
    # `Condition.wait`); a rule names the function, so the last dotted part counts too.
    short = fr.name.rsplit(".", 1)[-1]
    return any(p.search(fr.name) or p.search(short) for p in rule.frames)


def _by_file(rule: Rule, fr: Frame) -> bool:
    return any(p.search(fr.filename) for p in rule.files)


def _both(rule: Rule, fr: Frame) -> bool:
    return _by_name(rule, fr) and _by_file(rule, fr)


def _stack(rule: Rule, ctx: Context) -> str | None:
    return match_stacks(rule, ctx.stacks)


def match_stacks(rule: Rule, stacks: Iterable[StackSample]) -> str | None:
    """Where a stack rule holds in these dumps (also used on dumps found in a plain log)."""
    # `same_frame`: a generic name (`broadcast`) counts only inside the right file. Otherwise
    # prefer a frame matched by name (download_file) over one matched only by its file.
    # A thread stuck in the frame (unchanged, or held in it across both dumps) comes first.
    stacks = tuple(stacks)
    tests = (_both,) if rule.same_frame else (_by_name, _by_file)
    found: list[str] = []
    for test in tests:
        for sample in stacks:
            for th in sample.threads:
                if rule.unchanged and not th.unchanged:
                    continue
                at = next((i for i, f in enumerate(th.frames) if test(rule, f)), None)
                if at is None:
                    continue
                fr = th.frames[at]
                held = any(
                    test(rule, f) and i >= len(th.frames) - th.held for i, f in enumerate(th.frames)
                )
                still = UNCHANGED if th.unchanged else HELD if held else ""
                title = short_title(sample.title)
                detail = (
                    f"pid {sample.pid} ({title}) thread {th.name!r} in {fr.name} "
                    f"({fr.filename}:{fr.line}){still}"
                )
                if still:
                    return detail
                found.append(detail)
        if found:
            return found[0]
    return None


def _cdn_socket(rule: Rule, ctx: Context) -> str | None:
    conns, ago = ctx.obs.conns, 0.0
    if not conns:
        since = ctx.window.progress.last_progress_t
        for o in reversed(list(ctx.recent(ctx.th.socket_hold_s))):
            if since is not None and o.t < since:
                break
            if o.conns:
                conns, ago = o.conns, ctx.obs.t - o.t
                break
    if not conns:
        return None
    c = max(conns, key=lambda c: c.age_s)
    more = f" (and {len(conns) - 1} more)" if len(conns) > 1 else ""
    when = f", closed {ago:.0f} s ago (between download attempts)" if ago else ""
    return f"pid {c.pid} -> {c.host} ({c.ip}:{c.port}) {c.state} for {c.age_s:.0f} s{more}{when}"


def _gpu_spin(rule: Rule, ctx: Context) -> str | None:
    th = ctx.th
    for g in ctx.obs.gpus:
        start: Observation | None = None
        for o in reversed(list(ctx.window)):
            s = next((x for x in o.gpus if x.index == g.index), None)
            if s is None or spin_by(s, th) is None:
                break
            start = o
        by = spin_by(g, th)
        if start is not None and by is not None and ctx.obs.t - start.t >= th.gpu_spin_for_s:
            cpu = host_cpu(start, ctx.obs)
            return describe(g, ctx.obs.t - start.t, by, th, cpu)
    return None


def _no_progress(rule: Rule, ctx: Context) -> str | None:
    # `provable`: proven_after_s reached; before the stall limit classify() asks for a proof.
    return ctx.stall.detail if ctx.stall.stalled or ctx.stall.provable else None


def _gpu_cc(rule: Rule, ctx: Context) -> str | None:
    g = next((g for g in ctx.obs.gpus if g.cc in rule.values), None)
    return f"GPU {g.index} ({g.name or 'unknown'}) compute capability {g.cc}" if g else None


def _package(rule: Rule, ctx: Context) -> str | None:
    version = ctx.window.progress.facts.get(rule.name)
    return f"{rule.name} {version} in the server's environment" if version in rule.values else None


def _setting(rule: Rule, ctx: Context) -> str | None:
    value = ctx.window.progress.facts.get(rule.name)
    if rule.has_equals and value != rule.equals:
        return None
    if rule.has_not_equals and value == rule.not_equals:
        return None
    return f"{rule.name} = {'auto' if value is None else value}"


def _health(rule: Rule, ctx: Context) -> str | None:
    v = ctx.obs.server
    if v is None or v.health_status != rule.status:
        return None
    # The engine profile says what the status means: an SGLang 503 ("not_generating": its
    # one-token check got no answer) is a stall's evidence, not by itself a dead engine.
    if v.health_meaning not in (None, "dead"):
        return None
    confirm = ctx.th.health_confirm
    answers = [
        o.server.health_status
        for o in ctx.window.last(4 * confirm)
        if o.server is not None and o.server.health_status is not None
    ][-confirm:]
    if len(answers) < confirm or any(a != rule.status for a in answers):
        return None
    return f"/health answered {v.health_status} {confirm} times in a row"


def _process_gone(rule: Rule, ctx: Context) -> str | None:
    return f"pid {ctx.obs.procs.target_pid} is gone" if ctx.gone and ctx.obs.procs else None


EVALUATORS = {
    "log": _log,
    "stack": _stack,
    "cdn_socket": _cdn_socket,
    "gpu_spin": _gpu_spin,
    "no_progress": _no_progress,
    "gpu_cc": _gpu_cc,
    "package": _package,
    "setting": _setting,
    "health": _health,
    "process_gone": _process_gone,
}
SOURCE = {
    "log": "log",
    "stack": "stacks",
    "cdn_socket": "conns",
    "gpu_spin": "gpu",
    "no_progress": "progress",
    "gpu_cc": "gpu",
    "package": "facts",
    "setting": "facts",
    "health": "server",
    "process_gone": "procs",
}
