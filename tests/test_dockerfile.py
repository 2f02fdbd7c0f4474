"""The Dockerfile parses, installs the package the way the README does, and runs non-root.

No Docker engine runs here, so a small parser reads the Dockerfile the way BuildKit's front end
does for the parts we use: comments, line continuations, INSTRUCTION arguments, exec-form JSON.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
KNOWN = {
    "FROM", "ARG", "LABEL", "ENV", "WORKDIR", "COPY", "ADD", "RUN", "USER", "EXPOSE",
    "HEALTHCHECK", "ENTRYPOINT", "CMD", "VOLUME", "STOPSIGNAL", "SHELL", "ONBUILD",
}  # fmt: skip


class DockerfileError(ValueError):
    """A line the parser does not accept; the message names the line."""


def parse(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # comment lines inside a continuation are dropped, as BuildKit does
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        joined = (pending + line).strip()
        pending = ""
        word, _, args = joined.partition(" ")
        if word.upper() not in KNOWN or word != word.upper() or not args.strip():
            raise DockerfileError(f"line {number}: not an instruction: {joined[:60]!r}")
        out.append((word, args.strip()))
    if pending:
        raise DockerfileError("file ends inside a line continuation")
    return out


def instructions(name: str) -> list[str]:
    return [args for word, args in parse(DOCKERFILE.read_text()) if word == name]


def doc_code_lines() -> list[str]:
    lines: list[str] = []
    for doc in DOCS:
        if doc.exists():
            blocks = re.findall(r"```[a-z]*\n(.*?)```", doc.read_text(), flags=re.S)
            lines += [ln.strip() for block in blocks for ln in block.splitlines()]
    return lines


def test_parser_rejects_broken_dockerfiles() -> None:
    with pytest.raises(DockerfileError, match="not an instruction"):
        parse("FROM python:3.11-slim\nRUNN pip install .\n")
    with pytest.raises(DockerfileError, match="continuation"):
        parse("FROM python:3.11-slim\nRUN pip install . \\\n")
    assert parse("FROM a\n# c\nRUN x \\\n  # inner\n  && y\n") == [("FROM", "a"), ("RUN", "x && y")]


def test_dockerfile_parses_and_uses_a_slim_python_base() -> None:
    parsed = parse(DOCKERFILE.read_text())
    assert parsed[0][0] in {"ARG", "FROM"}
    args = dict(a.split("=", 1) for a in instructions("ARG") if "=" in a)
    (base,) = instructions("FROM")
    base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)
    assert re.fullmatch(r"python:3\.1[1-9]-slim(-\w+)?", base), base


def test_install_steps_match_the_readme() -> None:
    run_steps = [s for run in instructions("RUN") for s in re.split(r"\s*&&\s*", run)]
    installs = [s for s in run_steps if "pip install" in s]
    assert installs == ["python3 -m pip install ."]
    assert "python3 -m pip install ." in doc_code_lines()
    assert any(s.startswith("py-spy --version") for s in run_steps)


def test_copied_sources_exist_and_are_not_dockerignored() -> None:
    ignored = [
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    for copy in instructions("COPY"):
        *sources, _dest = shlex.split(copy)
        for src in sources:
            assert (ROOT / src).exists(), src
            hits = [p for p in ignored if fnmatch.fnmatch(src, p.lstrip("/").rstrip("/"))]
            assert not hits, f"{src} is excluded by .dockerignore {hits}"
    assert "tests" in ignored and ".git" in ignored


def test_runs_non_root_with_labels_and_exec_form_entrypoint() -> None:
    users = instructions("USER")
    assert users and users[-1] not in {"0", "root"}
    labels = " ".join(instructions("LABEL"))
    for key in ("title", "description", "version"):
        assert f"org.opencontainers.image.{key}=" in labels
    assert json.loads(instructions("ENTRYPOINT")[-1]) == ["hang-watchdog"]
    assert json.loads(instructions("CMD")[-1])[0] == "run"
    assert instructions("EXPOSE") == ["9433"]
