"""The prefilter's Hyperscan database compiled by a child process (sources/logs/hsbuild.py): it
finds what an in-process one finds, a child that cannot run leaves the in-process compile, and
the daemon's log source asks for it once its log's volume pays for Hyperscan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.fakes import workload
from tests.shipped import PATTERNS
from watchdog.core.knowledge.opdefs import load_ops
from watchdog.core.knowledge.signatures import load_signatures
from watchdog.core.state.openops import keep_with_ops
from watchdog.sources.logs import hsbuild, prefilter
from watchdog.sources.logs.prefilter import Prefilter
from watchdog.sources.logs.scan import prefilter_for
from watchdog.sources.logs.stackdumps import start_keys

hs = pytest.importorskip("hyperscan")
KEEP = keep_with_ops(load_signatures().log_keep_pattern(), load_ops())


@pytest.fixture
def at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon's prefilter loads Hyperscan at its first block (VOLUME_BYTES: 1 byte)."""
    monkeypatch.setattr(prefilter, "VOLUME_BYTES", 1)


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.usefixtures("at_once")
def test_a_child_compiled_database_finds_what_an_in_process_one_finds(seed: int) -> None:
    block = workload(seed) + b"odd keys: \x1b[0m a.b*c (x) \xff\xfe NCCL WARN\n"
    here = prefilter_for(KEEP, patterns=PATTERNS)
    apart = prefilter_for(KEEP, patterns=PATTERNS, in_child=True)
    plain = prefilter_for(KEEP, patterns=PATTERNS, hyperscan=False)
    assert apart.spans(block) == here.spans(block) == plain.spans(block)
    assert apart.engine == here.engine == "hyperscan"
    assert len(here.spans(block)) > 100  # the workload has many candidate lines
    keys = start_keys()
    assert keys is not None
    starts, starts_here = Prefilter(keys, in_child=True), Prefilter(keys)
    assert starts.spans(block) == starts_here.spans(block)


def test_the_child_database_is_the_childs() -> None:
    """compile_apart returns a loaded database (not None), so the child did compile it."""
    keys = (b"alpha", b"be.ta", b"\x1b")
    db = hsbuild.compile_apart(hs, keys)
    assert db is not None
    found: list[int] = []
    db.scan(
        b"xx be.ta yy alpha \x1b", match_event_handler=lambda _i, _s, end, _f, _c: found.append(end)
    )
    assert sorted(found) == [8, 17, 19]
    assert hsbuild.compile_apart(hs, ()) is None


@pytest.mark.parametrize("how", ["no interpreter", "missing interpreter", "child fails"])
@pytest.mark.usefixtures("at_once")
def test_a_child_that_cannot_compile_leaves_the_in_process_compile(
    monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    if how == "no interpreter":
        monkeypatch.setattr(hsbuild.sys, "executable", "")
    elif how == "missing interpreter":
        monkeypatch.setattr(hsbuild.sys, "executable", "/nonexistent/python3")
    else:
        monkeypatch.setattr(hsbuild, "_CHILD", "import sys; sys.exit(3)")
    assert hsbuild.compile_apart(hs, (b"key",)) is None
    pre = Prefilter(["key"], in_child=True)
    assert pre.spans(b"a\nthe key\nb\n") == [(2, 9)]
    assert pre.engine == "hyperscan"


def test_the_daemons_prefilter_loads_hyperscan_when_the_volume_asks() -> None:
    """A quiet log is scanned with bytes.find (no binding, no libstdc++ in the daemon's RSS);
    1 MiB within 10 s loads Hyperscan, and the candidate lines are the same either way."""
    now = [0.0]
    pre = Prefilter(["key"], in_child=True, clock=lambda: now[0])
    line = b"a line without it\nthe key line\n"
    small = line * 1000  # 33 KB a block
    for _ in range(40):  # 1.3 MB, but 33 KB every 11 s: never 1 MiB within a window
        now[0] += 11.0
        assert pre.spans(small)[:1] == [(18, 30)]
    assert pre.engine == "find"
    big = line * 20000  # 660 KB: two of them within 10 s
    pre.spans(big)
    assert pre.engine == "find"
    now[0] += 5.0
    assert pre.spans(big) == Prefilter(["key"], hyperscan=False).spans(big)
    assert pre.engine == "hyperscan"


def test_the_daemons_log_source_compiles_in_a_child(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from watchdog.config import Config
    from watchdog.daemon.wiring import build

    asked: list[int] = []
    real = prefilter.compile_apart

    def spy(hs_mod: Any, keys: Any) -> Any:
        asked.append(len(keys))
        return real(hs_mod, keys)

    monkeypatch.setattr(prefilter, "compile_apart", spy)
    log = tmp_path / "server.log"
    log.write_text("")
    cfg = Config(gpu_source="none", log_files=[str(log)], metrics_addr="off", stacks=False,
                 cdn_default=False)  # fmt: skip
    built = build(cfg)
    try:
        logs = built.daemon.source("logs")
        built.daemon.observe()  # the follower opens the log (at its end, as tail -F)
        assert asked == [] and logs.prefilter_engine == "find"  # a quiet log: no Hyperscan
        with log.open("ab") as f:  # a flood: 2 MiB at once
            f.write(b"INFO 12-04 10:00:00 [api_server.py:1] GET /v1/models 200 OK\n" * 34000)
        for _ in range(5):
            built.daemon.observe()
            if asked:
                break
        assert max(asked) > 100  # the parser's keys, compiled by the child
        assert logs.prefilter_engine == "hyperscan"
    finally:
        built.close()
