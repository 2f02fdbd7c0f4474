"""Faults in the operator's own files (`--signatures FILE`, `--engines FILE`, `--config`): a
regex that backtracks for ever, TOML that tomllib needs minutes for, a 10 MB string, bytes
that are not UTF-8. Each is exit 2 at once, naming the file and the entry or key; none reaches
the loop, where one log line would freeze it."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.simfixtures import REPO_ROOT, sim_env

pytestmark = pytest.mark.slow

QUIET = ("--no-cdn-default", "--gpu-source", "none", "--metrics-addr", "off")

SIGNATURE = """\
[[signature]]
id = "site_rule"
title = "A site rule"
when = "any"
fix = "Restart it."
[[signature.evidence]]
kind = "log"
pattern = '{pattern}'
decisive = true
"""

ENGINE = """\
[[engine]]
name = "siteengine"
title = "Site engine"
[engine.detect]
cmdline = ['{pattern}']
"""


@pytest.fixture
def target() -> Iterator[int]:
    proc = subprocess.Popen(["sleep", "600"])
    yield proc.pid
    proc.kill()
    proc.wait()


def watchdog(*args: str, timeout: float = 60) -> tuple[int, str, float]:
    """(exit code, stderr, seconds) of `python -m watchdog ARGS`."""
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "watchdog", *args],
        capture_output=True,
        text=True,
        env=sim_env(),
        cwd=REPO_ROOT,
        timeout=timeout,
        check=False,
    )
    return done.returncode, done.stderr, time.monotonic() - began


def refused(args: list[str], *needles: str) -> str:
    code, err, took = watchdog(*args)
    assert code == 2, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    for needle in needles:
        assert re.search(needle, err), (needle, err[-2000:])
    assert took < 20, f"took {took:.1f} s"  # bounded: the old parse took 18 s and more
    return err


CATASTROPHIC = ["(a+)+$", "(x*)*y", r"(\w+\s?)*$", "(?:a|b+)*c"]


@pytest.mark.parametrize("pattern", CATASTROPHIC)
def test_a_catastrophic_signature_regex_is_refused_at_load(
    tmp_path: Path, target: int, pattern: str
) -> None:
    site = tmp_path / "site.toml"
    site.write_text(SIGNATURE.format(pattern=pattern))
    refused(["signatures", "--check", str(site)], re.escape(str(site)), "signature .site_rule.",
            "key 'pattern'", "repeats a group")  # fmt: skip
    refused(["run", *QUIET, "--pid", str(target), "--signatures", str(site)],
            re.escape(str(site)), "key 'pattern'")  # fmt: skip


def test_a_catastrophic_engine_regex_is_refused_at_load(tmp_path: Path, target: int) -> None:
    site = tmp_path / "engines.toml"
    site.write_text(ENGINE.format(pattern="(a+)+$"))
    refused(["run", *QUIET, "--pid", str(target), "--engines", str(site)],
            re.escape(str(site)), "siteengine|engine\\[0\\]", "repeats a group")  # fmt: skip


def test_safe_repeats_still_load(tmp_path: Path) -> None:
    """A possessive or atomic inner repeat, and a plain bounded one, are not refused."""
    for pattern in [r"(?:\d++\.){3}\d+", r"(?>a+)+b", r"Worker (\d+) died", r"a{2,5}b+"]:
        site = tmp_path / "site.toml"
        site.write_text(SIGNATURE.format(pattern=pattern))
        code, err, _ = watchdog("signatures", "--check", str(site))
        assert code == 0, (pattern, err)


def _deep_headers(n: int) -> str:
    return "".join(f"[{'.'.join(['t'] * i)}]\n" for i in range(1, n))


def _many_dotted(n: int) -> str:
    return "".join(f"[x.k{i}.v]\n" for i in range(n))


@pytest.mark.parametrize("make", [_deep_headers, _many_dotted], ids=["deep", "many"])
def test_toml_that_tomllib_takes_minutes_for_is_refused_at_once(
    tmp_path: Path, target: int, make
) -> None:
    for flag, name in (("--signatures", "site.toml"), ("--engines", "engines.toml")):
        site = tmp_path / name
        site.write_text(make(100_000 if make is _many_dotted else 5000)[: 1 << 20])
        refused(["run", *QUIET, "--pid", str(target), flag, str(site)],
                re.escape(str(site)), "line \\d+", "dotted")  # fmt: skip
    site = tmp_path / "site.toml"
    refused(["signatures", "--check", str(site)], re.escape(str(site)), "dotted")


def test_a_config_file_nested_by_dotted_keys_is_refused_at_once(tmp_path: Path) -> None:
    cfg = tmp_path / "watchdog.toml"
    cfg.write_text(_deep_headers(3000)[: 1 << 20])
    refused(["run", *QUIET, "--config", str(cfg), "--", "sleep", "1"],
            re.escape(str(cfg)), "dotted")  # fmt: skip


@pytest.mark.parametrize("flag", ["--signatures", "--engines"])
def test_a_ten_megabyte_string_is_refused_naming_file_and_key(
    tmp_path: Path, target: int, flag: str
) -> None:
    site = tmp_path / "site.toml"
    site.write_text('[[signature]]\nid = "big"\ntitle = "' + "x" * (10 << 20) + '"\n')
    refused(["run", *QUIET, "--pid", str(target), flag, str(site)],
            re.escape(str(site)), "over the limit", "line 3", "key 'title'")  # fmt: skip


@pytest.mark.parametrize("flag", ["--signatures", "--engines"])
def test_invalid_utf8_is_refused_naming_file_line_and_key(
    tmp_path: Path, target: int, flag: str
) -> None:
    site = tmp_path / "site.toml"
    site.write_bytes(b'[[signature]]\nid = "bad"\ntitle = "caf\xe9 \xff"\n')
    refused(["run", *QUIET, "--pid", str(target), flag, str(site)],
            re.escape(str(site)), "line 3", "key 'title'", "not UTF-8")  # fmt: skip


def test_every_shipped_regex_passes_the_same_check() -> None:
    """The operator's regexes are held to the bound the shipped ones meet: the shipped files
    load through the same check (tomlcheck.regex), so this fails if one of them regresses."""
    from watchdog.core.knowledge.signatures import load_signatures
    from watchdog.engines.loader import load_engines

    assert load_signatures([]).signatures
    assert load_engines([]).profiles  # type: ignore[attr-defined]


def test_the_collective_hang_pattern_is_linear_on_a_repeated_nccl_line() -> None:
    """SGLang logs 100 KB lines; one repeating ProcessGroupNCCL made the old
    `ProcessGroupNCCL.*[Tt]imeout` quadratic (1.3 s per 64 KB line)."""
    from tests.fuzzkit import growth
    from watchdog.core.knowledge.signatures import load_signatures

    (sig,) = [s for s in load_signatures([]).signatures if s.id == "collective_hang"]
    (rule,) = [r for r in sig.evidence if r.pattern and "ProcessGroupNCCL" in r.pattern.pattern]
    assert rule.pattern is not None
    assert rule.pattern.search("[E ProcessGroupNCCL.cpp:475] [Rank 0] Watchdog timeout hit")

    def make(n: int) -> str:
        return "[E ProcessGroupNCCL.cpp:1] " * n

    ratio = growth(make, lambda line: rule.pattern.search(line), 200)  # type: ignore[union-attr,arg-type]
    assert ratio < 24, f"8x the line took {ratio:.0f}x the time (linear is ~8)"
