"""Every fix line the shipped knowledge prints works as written: the versions it installs were
published, the commands exist, the flags are read by the engine version at hand."""

from __future__ import annotations

import argparse

import pytest

from watchdog.commands.cli import build_parser
from watchdog.core.knowledge.fixlines import FixChecker
from watchdog.core.knowledge.published import Published, load_published, version_key
from watchdog.core.knowledge.tomlcheck import SignatureError
from watchdog.knowledge import Knowledge, load_knowledge
from watchdog.preflight import checks_cubins, checks_engine, checks_toolchain
from watchdog.preflight.checks_gpu import GpuInfo, GpuInventory


@pytest.fixture(scope="module")
def knowledge() -> Knowledge:
    return load_knowledge()


@pytest.fixture(scope="module")
def checker(knowledge: Knowledge) -> FixChecker:
    return FixChecker(knowledge.published)


def shipped_groups(k: Knowledge) -> list[tuple[str, tuple[str, ...]]]:
    """Each list of lines the shipped knowledge can print together (a verdict's fix and
    commands, per engine; a known-bad entry's fixes; a fallback as each engine spells it)."""
    s = k.signatures
    groups: list[tuple[str, tuple[str, ...]]] = []
    for sig in s.signatures:
        groups.append((sig.id, (sig.fix, *sig.commands)))
        for engine, text in sig.engines.items():
            t = sig.text_for(engine)
            groups.append((f"{sig.id}[{engine}]", (t.fix, *t.commands, text.fix)))
    groups += [(f"generic {g.id}", g.commands) for g in s.generic]
    groups += [(f"known_bad {kb.id}", kb.fixes) for kb in s.known_bad]
    for fb in s.fallbacks.values():
        line = " ".join(["vllm serve MODEL ...", *fb.args])
        legacy = " ".join(f"{k}={v}" for k, v in fb.legacy_env.items())
        groups.append((f"fallback {fb.name}", (line, legacy)))
    for profile in k.engines.profiles:
        start = {"sglang": "sglang serve --model-path MODEL", "trtllm": "trtllm-serve MODEL"}
        for name, fb in profile.fallbacks.items():
            if profile.name in start and fb.args:
                line = " ".join([start[profile.name], *fb.args])
                groups.append((f"{profile.name} fallback {name}", (line,)))
    return groups


def test_the_record_is_dated_and_names_every_package_a_fix_installs(knowledge: Knowledge) -> None:
    pub = knowledge.published
    assert pub.recorded and pub.source
    for name in ("flashinfer-python", "flashinfer-cubin", "vllm", "sglang", "tensorrt-llm"):
        pkg = pub.package(name)
        assert pkg is not None and pkg.versions, name
    jit = pub.package("flashinfer-jit-cache")
    assert jit is not None and jit.index and not jit.versions  # not on PyPI: its index only


def test_every_shipped_fix_line_works_as_written(knowledge: Knowledge, checker: FixChecker) -> None:
    groups = shipped_groups(knowledge)
    assert len(groups) > 50  # every signature, engine text, known-bad entry and fallback
    bad = {
        f"{gid}: {line[:100]}": problems
        for gid, lines in groups
        for line, problems in checker.check_all(lines).items()
    }
    assert not bad, "\n".join(f"{k}\n  -> {v}" for k, v in bad.items())


def test_the_checker_reads_commands_in_prose(checker: FixChecker) -> None:
    assert checker.commands_in("or serve it eagerly: vllm serve ... --enforce-eager") == [
        "vllm serve ... --enforce-eager"
    ]
    assert checker.commands_in("upgrade vLLM past the fix (vllm PR #45917)") == []
    assert checker.commands_in("run `flashinfer download-cubin` there") == [
        "flashinfer download-cubin"
    ]


# Planted lines, each wrong in one way the recorded lists can tell.
BAD_LINES = [
    # The line `hang-watchdog demo` printed: no flashinfer-cubin 0.7.2.post1 was ever published.
    'pip install "flashinfer-cubin==0.7.2.post1"',
    "pip install flashinfer-cubin==FLASHINFER_VERSION",  # a placeholder pip cannot install
    "pip install 'flashinfer-python>=9.0'",  # no such release
    "pip install flashinfer-jit-cache==0.6.13",  # not on PyPI, and no index named
    "vllm serve MODEL ... --no-such-flag",  # a flag vLLM does not read
    "vllm serve MODEL ... --attention-config.use_trtllm_attention=0",  # no older spelling
    "sglang serve --model-path MODEL --attention-config.use_trtllm_attention=0",  # vLLM's flag
    "flashinfer download-cubins   # a misspelt command",
    "hang-watchdog preflight --no-such-flag",
]


@pytest.mark.parametrize("line", BAD_LINES)
def test_a_planted_bad_line_fails(checker: FixChecker, line: str) -> None:
    assert checker.check(line), line


GOOD_LINES = [
    'pip install "flashinfer-cubin==0.6.13"',
    "pip install 'flashinfer-python>=0.6.7.post2'",
    "pip install flashinfer-jit-cache==0.6.13+cu129 --extra-index-url https://flashinfer.ai/whl/cu129",
    "vllm serve MODEL ... --attention-config.use_trtllm_attention=0   # vLLM >= 0.13.0",
    "NCCL_DEBUG=INFO sglang serve --model-path MODEL ... --attention-backend flashinfer",
]


@pytest.mark.parametrize("line", GOOD_LINES)
def test_the_near_misses_pass(checker: FixChecker, line: str) -> None:
    assert checker.check(line) == []


def test_a_flag_is_judged_against_the_detected_engine_version(knowledge: Knowledge) -> None:
    line = "vllm serve MODEL ... --attention-config.use_trtllm_attention=0"
    old = FixChecker(knowledge.published, {"vllm": "0.12.0"})
    new = FixChecker(knowledge.published, {"vllm": "0.13.0"})
    assert any("0.13.0" in p for p in old.check(line))
    assert new.check(line) == []
    cmd = "flashinfer download-cubin"
    assert FixChecker(knowledge.published, {"flashinfer-python": "0.3.1"}).check(cmd)
    assert FixChecker(knowledge.published, {"flashinfer-python": "0.7.4"}).check(cmd) == []


def test_our_own_recorded_flags_are_in_the_cli(knowledge: Knowledge) -> None:
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for prog in knowledge.published.programs:
        if prog.words[0] != "hang-watchdog":
            continue
        options = {o for a in subs.choices[prog.words[1]]._actions for o in a.option_strings}
        assert set(prog.flags) <= options, prog.name


def test_version_order_follows_pep440() -> None:
    order = ["0.6.7rc1", "0.6.7", "0.6.7.post1", "0.6.7.post2", "0.6.8", "0.7.0", "0.7.2.post1"]
    assert sorted(reversed(order), key=version_key) == order
    assert version_key("0.6.16+cu130") == version_key("0.6.16")


def test_a_bad_record_is_an_error_naming_the_key() -> None:
    with pytest.raises(SignatureError, match="flag_since"):
        load_published('[[program]]\nname = "x"\nflag_since = { "--y" = "1.0" }\n', "t.toml")
    with pytest.raises(SignatureError, match="unknown key"):
        load_published("bogus = 1\n", "t.toml")
    assert load_published("", "t.toml") == Published(recorded="", source="")


# Preflight's fix lists, for every FlashInfer release recorded: each one works as written.
def _inventory(cc: str) -> GpuInventory:
    return GpuInventory(gpus=(GpuInfo(index=0, name="GPU", cc=cc),), driver="580")


@pytest.mark.parametrize("jit_cache", [None, "0.6.10+cu129"])
def test_preflight_fix_lines_work_for_every_flashinfer_release(
    knowledge: Knowledge, checker: FixChecker, jit_cache: str | None
) -> None:
    pub = knowledge.published
    fi = pub.package("flashinfer-python")
    assert fi is not None
    profile = knowledge.engines.get("sglang")
    assert profile is not None
    seen = 0
    for version in fi.versions:
        for cubin in (None, "0.6.7"):
            versions = {
                "flashinfer-python": version,
                "flashinfer-cubin": cubin,
                "flashinfer-jit-cache": jit_cache,
            }
            results = [
                checks_cubins.check_cubin_package(versions, {}, pub),
                checks_cubins.check_jit_cache_package(versions, pub),
                checks_cubins.check_cubin_download(
                    versions, {"FLASHINFER_NO_DOWNLOAD": "1"}, None, 1.0, pub
                ),
                checks_toolchain.check_nvcc(
                    _inventory("10.3"), versions, {}, checks_toolchain.DEFAULT_CUDA_ROOT, 1.0
                ),
                checks_engine.check_attention_path(profile, (), _inventory("10.0"), versions, pub),
                checks_cubins.check_cubin_store(
                    versions, {"HOME": "/nonexistent"}, _inventory("10.3"), pub
                ),
            ]
            for r in results:
                if r is None:
                    continue
                seen += len(r.fixes)
                check = FixChecker(pub, versions)
                bad = check.check_all(r.fixes)
                assert not bad, (version, cubin, r.id, bad)
    assert seen > 100
    del checker
