"""The Window: progress facts built from observations, restarts, counters, bars and eviction."""

from __future__ import annotations

from tests.obsbuilder import Timeline, events, procs, sample_lines, window_of
from watchdog.core.model import Observation, ServerSample
from watchdog.core.state.window import Window


def _metrics(iterations: float, running: float = 1.0) -> ServerSample:
    return ServerSample(
        up=True, health_status=200, iterations=iterations, running=running, waiting=0.0
    )


def test_restart_rebaselines_progress() -> None:
    tl = Timeline(procs=procs(100), facts={"flashinfer-python": "0.6.7", "gpu_cc": "10.3"})
    tl.tick(logs=events(sample_lines("logs/g_vllm16301_offline_startup_then_stuck_0pct.log")))
    tl.ticks(20)
    w = window_of(tl.obs)
    assert w.progress.phase == "ready" and w.progress.pending
    assert w.progress.bars == {"Processed prompts": (0, 1)}
    restart_t = tl.now
    w.append(tl.tick(procs=procs(200, restarted=True), facts={}))
    p = w.progress
    assert (p.phase, p.pending, p.bars) == ("starting", False, {})
    assert p.last_progress_t == restart_t and p.last_progress_what == "server restarted"
    assert p.facts == {"gpu_cc": "10.3"}  # the hardware outlives a restart, the packages may not


def test_new_target_pid_without_flag_also_rebaselines() -> None:
    tl = Timeline(procs=procs(100), server=_metrics(50.0))
    tl.ticks(3)
    w = window_of(tl.obs)
    assert w.progress.counters["iterations"] == 50.0
    w.append(tl.tick(procs=procs(300), server=None))
    assert w.progress.counters == {}
    assert w.progress.last_progress_what == "server restarted"


def test_restart_tick_keeps_the_new_pid_and_its_facts() -> None:
    tl = Timeline(procs=procs(100), facts={"flashinfer-python": "0.6.7"})
    tl.ticks(3)
    w = window_of(tl.obs)
    w.append(tl.tick(procs=procs(200, restarted=True), facts={"flashinfer-python": "0.6.7.post2"}))
    assert w.progress.target_pid == 200
    assert w.progress.facts.get("flashinfer-python") == "0.6.7.post2"


def test_counters_that_drop_after_a_restart_are_a_new_baseline() -> None:
    tl = Timeline(procs=procs(100))
    for i in range(5):
        tl.tick(server=_metrics(500.0 + i))
    w = window_of(tl.obs)
    before = w.progress.last_progress_t
    assert before == tl.obs[-1].t
    w.append(tl.tick(procs=procs(200, restarted=True), server=_metrics(3.0)))
    assert w.progress.counters["iterations"] == 3.0
    w.append(tl.tick(procs=procs(200), server=_metrics(3.0)))
    stuck_t = w.progress.last_progress_t
    w.append(tl.tick(procs=procs(200), server=_metrics(4.0)))
    assert w.progress.last_progress_t == tl.obs[-1].t > stuck_t
    assert w.progress.last_progress_what == "server iterations advanced"


def test_counter_drop_without_restart_does_not_count_as_progress() -> None:
    tl = Timeline(procs=procs(100))
    tl.tick(server=_metrics(500.0))
    tl.tick(server=_metrics(500.0))
    w = window_of(tl.obs)
    last = w.progress.last_progress_t
    w.append(tl.tick(server=_metrics(10.0)))
    assert w.progress.last_progress_t == last
    assert w.progress.counters["iterations"] == 10.0
    w.append(tl.tick(server=_metrics(11.0)))
    assert w.progress.last_progress_t == tl.obs[-1].t


def test_tqdm_bar_n_over_total_is_tracked() -> None:
    tl = Timeline(procs=procs())
    bars = [e for e in events(sample_lines("logs/g_vllm16050_processed_prompts_slowing.log"))]
    progress = [e for e in bars if e.kind == "progress"]
    assert len(progress) >= 3, "the sample should hold several Processed prompts redraws"
    w = Window()
    for ev in progress:
        w.append(tl.tick(logs=(ev,)))
        n, total = int(ev.fields["n"]), int(ev.fields["total"])
        desc = ev.fields["desc"]
        assert w.progress.bars[desc] == (n, total)
        assert w.progress.bar_desc == desc
        assert w.progress.ratio == n / total
        assert w.progress.pending == (n < total)
    # a redraw with the same n is not progress
    last = w.progress.last_progress_t
    w.append(tl.tick(logs=(progress[-1],)))
    assert w.progress.last_progress_t == last


def test_weight_shard_bar_sets_the_loading_phase() -> None:
    tl = Timeline()
    loading = [e for e in events(sample_lines("logs/h_vllm44985_safetensors_weight_loading.log"))]
    w = Window()
    w.append(tl.tick(logs=(loading[0],)))
    assert w.progress.phase == "loading" and not w.progress.pending


def test_eviction_by_span() -> None:
    tl = Timeline(step=1.0)
    tl.ticks(100)
    w = window_of(tl.obs, span_s=30.0)
    kept = list(w)
    assert len(w) == 31
    assert kept[0].t == tl.obs[-1].t - 30.0 and kept[-1] is tl.obs[-1]
    assert w.since(tl.obs[-1].t - 5.0) == tl.obs[-6:]


def test_eviction_by_max_len() -> None:
    tl = Timeline(step=0.1)
    tl.ticks(50)
    w = Window(span_s=600.0, max_len=20)
    for o in tl.obs:
        w.append(o)
    assert len(w) == 20 and w.latest is tl.obs[-1]


def test_progress_facts_survive_eviction() -> None:
    tl = Timeline(procs=procs())
    tl.tick(logs=events(sample_lines("logs/g_vllm16301_offline_startup_then_stuck_0pct.log")))
    tl.ticks(100)
    w = window_of(tl.obs, span_s=30.0)
    assert len(w) == 31
    assert w.progress.pending and w.progress.pending_since == tl.obs[0].t
    assert w.progress.bars == {"Processed prompts": (0, 1)}


# -- memory bounded by the window, not by log volume ---------------------------------------


def _line_obs(t: float, n: int, chars: int) -> Observation:
    from watchdog.core.model import LogEvent

    text = "Traceback: " + "x" * chars
    return Observation(t=t, wall=t, logs=tuple(LogEvent("line", text) for _ in range(n)))


def test_a_huge_line_is_kept_as_its_head_and_tail() -> None:
    from watchdog.core.state.window import MAX_EVENT_CHARS

    w = Window(span_s=600)
    w.append(_line_obs(0.0, 1, 65536))
    (ev,) = w.latest.logs
    assert len(ev.line) < MAX_EVENT_CHARS + 64
    assert ev.line.startswith("Traceback: ") and "characters ...]" in ev.line


def test_log_text_held_stops_growing_with_volume() -> None:
    w = Window(span_s=10_000, max_len=100_000, max_chars=1 << 20)
    held = []
    for t in range(2000):  # 2000 ticks x 20 lines x 4 KB = 160 MB offered
        w.append(_line_obs(float(t), 20, 4000))
        held.append(w.chars)
    from watchdog.core.state.window import OLD_EVENT_CHARS

    offered = 2000 * 20 * 4011
    floor = 2000 * 20 * (OLD_EVENT_CHARS + 48)  # every old line shrunk to its head and tail
    assert max(held) <= (1 << 20) + 20 * 4200 + floor
    assert held[-1] < offered / 10


def test_the_old_servers_last_words_after_a_restart_are_not_the_new_ones() -> None:
    """systemd stopped the old SGLang (its launcher printed SIGQUIT ... one child failed) and
    the line is read only after the new pid appeared: it precedes the new server's first
    startup line in the file, so it is dropped; what follows that line is kept."""
    from watchdog.core.model import LogEvent, ProcSnapshot
    from watchdog.core.thresholds import Thresholds

    RESTART_ECHO_S = Thresholds().restart_echo_s

    dying = LogEvent(
        "line", "SIGQUIT received. signum=None, frame=None. It usually means one child failed."
    )
    boot = LogEvent("version", "sglang version 0.5.23", fields={"version": "0.5.23"})
    crash = LogEvent("line", "Scheduler hit an exception: RuntimeError")
    w = Window()
    w.append(Observation(t=0.0, wall=0.0, procs=ProcSnapshot(100, True)))
    w.append(Observation(t=1.0, wall=1.0, procs=ProcSnapshot(200, True), logs=(dying,)))
    w.append(Observation(t=2.0, wall=2.0, procs=ProcSnapshot(200, True), logs=(dying, boot, crash)))
    kept = [ev.line for o in w for ev in o.logs]
    assert kept == [boot.line, crash.line] and w.echo_dropped == 2
    # No startup line at all: the old server's lines stop being dropped after RESTART_ECHO_S.
    w = Window()
    w.append(Observation(t=0.0, wall=0.0, procs=ProcSnapshot(100, True)))
    w.append(Observation(t=1.0, wall=1.0, procs=ProcSnapshot(200, True), logs=(dying,)))
    late = 1.0 + RESTART_ECHO_S + 0.5
    w.append(Observation(t=late, wall=late, procs=ProcSnapshot(200, True), logs=(crash,)))
    assert [ev.line for o in w for ev in o.logs] == [crash.line]
    # The bound is the thresholds' (restart_echo_s): a longer one still drops that line.
    w = Window(thresholds=Thresholds(restart_echo_s=RESTART_ECHO_S * 3))
    w.append(Observation(t=0.0, wall=0.0, procs=ProcSnapshot(100, True)))
    w.append(Observation(t=1.0, wall=1.0, procs=ProcSnapshot(200, True), logs=(dying,)))
    w.append(Observation(t=late, wall=late, procs=ProcSnapshot(200, True), logs=(crash,)))
    assert [ev.line for o in w for ev in o.logs] == [] and w.echo_dropped == 2
    # Without a restart nothing is dropped.
    w = Window()
    w.append(Observation(t=0.0, wall=0.0, procs=ProcSnapshot(100, True), logs=(dying,)))
    assert [ev.line for o in w for ev in o.logs] == [dying.line] and w.echo_dropped == 0


def test_a_supervised_childs_own_lines_are_never_taken_for_the_old_servers() -> None:
    """In supervise mode each server has its own pipe: its crash right after a restart counts."""
    from watchdog.core.model import LogEvent, ProcSnapshot

    crash = LogEvent("line", "EngineDeadError: EngineCore encountered an issue.", source="child")
    w = Window()
    w.append(Observation(t=0.0, wall=0.0, procs=ProcSnapshot(100, True)))
    w.append(Observation(t=1.0, wall=1.0, procs=ProcSnapshot(200, True), logs=(crash,)))
    assert [ev.line for o in w for ev in o.logs] == [crash.line] and w.echo_dropped == 0


STATS = (
    "(APIServer pid=22918) INFO 12-04 21:23:11 [loggers.py:335] Engine 000: Avg prompt "
    "throughput: 118.2 tokens/s, Avg generation throughput: 472.6 tokens/s, Running: 0 reqs, "
    "Waiting: 0 reqs, CPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%"
)


def _tokens(n: float) -> ServerSample:
    return ServerSample(up=True, health_status=200, generation_tokens=n, running=4.0, waiting=0.0)


def test_a_stats_line_logged_into_a_hang_is_no_progress_where_counters_are_read() -> None:
    """vLLM's stats line averages its last 10 s: logged 6 s into a real hang it still says
    472 tokens/s. Where /metrics gives the token counters each tick they say when tokens moved,
    so the line must not restart the stall clock (it did, and the cubin stall was named at
    14.7 s instead of 8). With no counters, the line is the only progress there is."""
    tl = Timeline(procs=procs(100))
    for i in range(5):
        tl.tick(server=_tokens(100.0 * (i + 1)))
    stopped = tl.now - 1.0
    tl.ticks(6, server=_tokens(500.0))
    tl.tick(server=_tokens(500.0), logs=events([STATS]))
    assert window_of(tl.obs).progress.last_progress_t == stopped
    blind = Timeline(procs=procs(100))
    blind.ticks(6)
    blind.tick(logs=events([STATS]))
    assert window_of(blind.obs).progress.last_progress_what == "throughput in the stats line"
