"""Fixtures of the real-engine tier: the real-engine venv, the tiny model, the plugin, servers.

The tier is marked `real_engine` and left out of the main run (pyproject's addopts); run it with
`python -m pytest -m real_engine tests/real_engine` after `tests/real_engine/install.sh`.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.real_engine.dtype_probe import choose_dtype
from tests.real_engine.engine import HERE, Hang, VllmServer, make_model, plugin_site
from tests.real_engine.watch import Watchdog

pytestmark = pytest.mark.real_engine


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(HERE):
            item.add_marker(pytest.mark.real_engine)


@pytest.fixture(scope="session")
def real_python() -> str:
    """The real-engine venv's python: $HANG_WATCHDOG_REAL_ENGINE_PYTHON, else install.sh's."""
    given = os.environ.get("HANG_WATCHDOG_REAL_ENGINE_PYTHON")
    if given:
        return given
    out = subprocess.run(
        [str(HERE / "install.sh")], check=True, capture_output=True, text=True, timeout=3600
    )
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def tiny_model(real_python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(real_python, tmp_path_factory.mktemp("model") / "tiny-llama")


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return plugin_site(tmp_path_factory.mktemp("plugin"))


@pytest.fixture(scope="session")
def serving_dtype(
    real_python: str, tiny_model: Path, site: Path, tmp_path_factory: pytest.TempPathFactory
) -> str:
    """The dtype this CPU serves (tests/real_engine/dtype_probe.py), found once per session;
    a machine where none serves ends the tier here with that one message."""
    choice = choose_dtype(real_python, tiny_model, site, tmp_path_factory.mktemp("dtype-probe"))
    print(f"\n[real-engine] {choice.describe()}")
    if choice.dtype is None:
        pytest.exit(f"real-engine tier: {choice.describe()}", returncode=1)
    return choice.dtype


@pytest.fixture
def servers(
    real_python: str, tiny_model: Path, site: Path, tmp_path: Path, serving_dtype: str
) -> Iterator[Callable[..., VllmServer]]:
    """Start real vLLM servers; every one is stopped (its whole process group) afterwards."""
    made: list[VllmServer] = []

    def start(hang: Hang | None = None, **kw: Any) -> VllmServer:
        work = tmp_path / f"vllm{len(made)}"
        kw.setdefault("dtype", serving_dtype)
        server = VllmServer(real_python, tiny_model, work, site, hang=hang or Hang(), **kw)
        made.append(server.start())
        return server

    yield start
    for server in made:
        server.stop()


@pytest.fixture
def watchdogs(tmp_path: Path) -> Iterator[Callable[..., Watchdog]]:
    made: list[Watchdog] = []

    def start(*args: str, name: str = "watchdog", env: dict[str, str] | None = None) -> Watchdog:
        wd = Watchdog(tmp_path, args, name=name, env=env)
        made.append(wd.start())
        return wd

    yield start
    for wd in made:
        wd.stop()
