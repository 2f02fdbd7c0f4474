"""Engine profiles: the shipped ones load, operator files are validated (file, entry, key),
and the engine is detected from a command line or process titles."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes import GOOD
from watchdog.engines.detect import EngineInForce, detect_engine
from watchdog.engines.loader import EngineError, load_engines
from watchdog.sim.trtllm_launch import launcher_argv
from watchdog.sources.logs.parse import LogPatterns, parse_line


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "engines.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_shipped_profiles_load() -> None:
    engines = load_engines()
    assert engines.names == ("vllm", "sglang", "trtllm", "tgi")
    sgl = engines.get("sglang")
    assert sgl is not None and sgl.health_meaning(503) == "not_generating"
    assert engines.get("vllm").health_meaning(503) == "dead"  # type: ignore[union-attr]
    assert sgl.fallbacks["disable_trtllm_attention"].args == ("--attention-backend", "flashinfer")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (('title = "Acme Serve"', 'titel = "Acme"'), "engine 'acme': unknown key(s) 'titel'"),
        (('role = "worker"', 'role = "gpu_thing"'), "role[0]: key 'role': unknown role"),
        (("'acme-serve'", "'acme-(serve'"), "detect: key 'cmdline': invalid regex"),
        (('type = "counter"', 'type = "gauge"'), "sample[0]: key 'field'"),
        (('kind = "stats"', 'kind = "banana"'), "log.rule[0]: key 'kind'"),
        (('needle = "acme step "', 'needle = "other "'), "must start with the needle"),
        (('500 = "dead"', '500 = "sad"'), "health: key 'answers'"),
        (('name = "acme"', 'name = "Acme Engine"'), "engine[0]: key 'name'"),
        (('title = "Acme Serve"', 'packages = "acme-kernels"'), "engine 'acme': key 'packages'"),
        (('title = "Acme Serve"', "packages = [3]"), "engine 'acme': key 'packages'"),
        (('title = "Acme Serve"', 'packages = ["acme kernels"]'), "not a distribution name"),
        (('title = "Acme Serve"', "version_package = 1"), "key 'version_package'"),
    ],
)
def test_bad_profile_names_file_entry_and_key(
    tmp_path: Path, edit: tuple[str, str], message: str
) -> None:
    path = write(tmp_path, GOOD.replace(*edit, 1))
    with pytest.raises(EngineError) as exc:
        load_engines([path])
    assert str(path) in str(exc.value) and message in str(exc.value)


def test_cli_exits_2_on_a_bad_engine_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from watchdog.commands.cli import main

    path = write(tmp_path, GOOD.replace('role = "worker"', 'role = "boss"'))
    argv = ["run", "--gpu-source", "none", "--no-cdn-default", "--metrics-addr", "off"]
    assert main([*argv, "--engines", str(path), "--pid", "1"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "role[0]: key 'role': unknown role 'boss'" in err
    assert main([*argv, "--engine", "nope", "--pid", "1"]) == 2
    assert "'nope' is not a known engine" in capsys.readouterr().err


def test_engine_packages_come_from_the_profiles(tmp_path: Path) -> None:
    from watchdog.sources.pyenv import COMMON, packages_for

    PACKAGES = packages_for(load_engines())  # noqa: N806 - what the knowledge bundle holds
    assert load_engines().get("sglang").distributions == (  # type: ignore[union-attr]
        "sglang",
        "sglang-kernel",
        "sgl-kernel",
    )
    assert PACKAGES[:2] == ("vllm", "sglang") and "tensorrt_llm" in PACKAGES
    assert PACKAGES[-len(COMMON) :] == COMMON and "torch" in COMMON
    text = GOOD.replace(
        'title = "Acme Serve"',
        'version_package = "acme-serve"\npackages = ["acme-kernels", "tensorrt-llm"]',
    )
    got = packages_for(load_engines([write(tmp_path, text)]))
    assert got[:2] == ("acme-serve", "acme-kernels")  # an operator profile's packages first
    assert "tensorrt-llm" in got and "tensorrt_llm" not in got  # one spelling per project
    assert set(PACKAGES) - {"tensorrt_llm"} < set(got)


def test_operator_engine_is_detected_and_its_lines_read(tmp_path: Path) -> None:
    engines = load_engines([write(tmp_path, GOOD)])
    acme = engines.get("acme")
    assert acme is not None and engines.names[0] == "acme"
    profile, why = detect_engine(engines, "/usr/bin/acme-serve --port 1")
    assert profile.name == "acme" and "command line" in why
    assert acme.role_of("acme::gpu3") == ("worker", 3)
    ev = parse_line("acme step 7 queue=2", patterns=LogPatterns.from_engines(engines))
    assert ev is not None and ev.kind == "stats"
    assert ev.fields == {"iteration": 7, "waiting": 2, "stepped": True}


def test_detection_from_command_lines_and_titles() -> None:
    engines = load_engines()
    cases = {
        "python3 -m sglang.launch_server --model-path m": "sglang",
        "/venv/bin/sglang serve --model-path m": "sglang",
        "/venv/bin/vllm serve meta/llama --port 8000": "vllm",
        "python -m vllm.entrypoints.openai.api_server --model m": "vllm",
        "trtllm-serve /models/llama --backend pytorch": "trtllm",
        # pip's console script, as the simulator's launcher runs it too
        "/usr/bin/python3 /usr/local/bin/trtllm-serve serve m --backend pytorch": "trtllm",
        "python3 my_server.py": "unknown",
        "python3 -m watchdog.sim.vllm_sim --engine trtllm": "unknown",  # no trtllm-serve in it
    }
    assert {c: detect_engine(engines, c)[0].name for c in cases} == cases
    by_title, why = detect_engine(engines, "python3 x.py", ["sglang::scheduler_TP1"])
    assert by_title.name == "sglang" and "title" in why
    sgl = engines.get("sglang")
    assert sgl is not None
    assert sgl.role_of("sglang::scheduler_DP0_TP3") == ("scheduler", 3)
    assert sgl.role_of("sglang::scheduler") == ("scheduler", None)
    assert sgl.role_of("sglang::detokenizer") == ("detokenizer", None)
    vllm = engines.get("vllm")
    assert vllm is not None and vllm.role_of("VLLM::Worker_TP1") == ("worker", 1)
    trt = engines.get("trtllm")
    assert trt is not None
    sim_argv = ["/usr/bin/python3", "/tmp/trtllm-bin-x/trtllm-serve", *launcher_argv("m")]
    assert trt.role_of(" ".join(sim_argv)) == ("api_server", None)


def test_forced_engine_and_unknown_name() -> None:
    engines = load_engines()
    forced = EngineInForce.at_start(engines, "sglang")
    assert forced.profile.name == "sglang"
    assert forced.observed(engines, "vllm serve x", []) is forced
    with pytest.raises(ValueError, match="not a known engine"):
        EngineInForce.at_start(engines, "nope")
    auto = EngineInForce.at_start(engines).observed(engines, "python -m sglang.launch_server", [])
    assert auto.profile.name == "sglang" and not auto.forced
    assert "progress counters in /metrics" in EngineInForce.at_start(engines).profile.missing()
