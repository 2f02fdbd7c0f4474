"""Every shipped shape gives the watchdog CPU priority over the server it watches: a watchdog
starved by a busy server falls behind its tick and misses the hang it is there to see."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]


def unit_settings(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            out[key.strip()] = value.strip()
    return out


def test_the_systemd_units_weigh_the_watchdog_above_the_server() -> None:
    for name in ("hang-watchdog.service", "hang-watchdog@.service"):
        got = unit_settings(REPO / "systemd" / name)
        assert int(got["CPUWeight"]) > 100, name  # systemd's default weight is 100
        assert int(got["Nice"]) < 0, name
    for server in ("vllm.service", "sglang.service"):
        got = unit_settings(REPO / "systemd" / server)
        assert int(got.get("CPUWeight", "100")) <= 100, server


def containers(doc: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key == "containers" and isinstance(value, list):
                found += [c for c in value if isinstance(c, dict)]
            else:
                found += containers(value)
    elif isinstance(doc, list):
        for item in doc:
            found += containers(item)
    return found


def millicores(text: str) -> float:
    return float(text[:-1]) if text.endswith("m") else float(text) * 1000


def test_the_kubernetes_sidecars_request_a_quarter_core() -> None:
    for name in ("deployment.yaml", "multinode/leaderworkerset.yaml"):
        docs = list(yaml.safe_load_all((REPO / "kubernetes" / name).read_text()))
        sidecars = [c for c in containers(docs) if c.get("name") == "hang-watchdog"]
        assert sidecars, name
        for c in sidecars:
            assert millicores(str(c["resources"]["requests"]["cpu"])) >= 250, (name, c["resources"])
