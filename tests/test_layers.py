"""The layer rule, read from the imports: data flows sources -> core -> outputs/remediation, and
no module reaches back up the flow or keeps state in a module-level container.

Every import is counted, wherever it sits (a function body, `if TYPE_CHECKING:`): a lazy import
is still an edge. The scan reads the source with `ast`, so nothing is imported to check it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "watchdog"
# Stand-ins that copy upstream code's shape (FlashInfer's JIT loader, a torch stub) for the
# simulators; they are not the watchdog's own modules.
SKIPPED = ("sim/flashinfer", "sim/torch_stub")

# importer layer -> layers it must not import. A layer is the first package under watchdog/;
# a top-level module (config, configkeys, configcheck, the package itself) is its own layer.
FORBIDDEN: dict[str, frozenset[str]] = {
    "outputs": frozenset({"daemon", "sources", "commands"}),
    "remediation": frozenset({"daemon", "sources", "outputs", "commands"}),
    "sources": frozenset({"outputs", "commands"}),
    "daemon": frozenset({"commands"}),
    # The knowledge loader reads files into data for the wiring, `replay` and `preflight`: it
    # builds on core, engines and the package lists, never on what runs or reports.
    "knowledge": frozenset(
        {"daemon", "outputs", "remediation", "commands", "preflight", "sim", "config"}
    ),
    # Config validation checks values (it may parse a CDN host as the conns source does): it
    # never loads knowledge, builds the daemon, or imports the config module that calls it.
    "configcheck": frozenset(
        {"daemon", "outputs", "remediation", "commands", "preflight", "sim", "config"}
        | {"knowledge", "core", "engines"}
    ),
}
MUTABLE_CALLS = frozenset(
    {"list", "dict", "set", "bytearray", "defaultdict", "deque", "Counter", "OrderedDict"}
    | {"ChainMap", "WeakValueDictionary", "WeakKeyDictionary", "WeakSet"}
)
MUTATORS = frozenset(
    {"append", "extend", "insert", "remove", "pop", "popitem", "clear", "update", "setdefault"}
    | {"add", "discard", "sort", "reverse", "appendleft", "extendleft", "__setitem__"}
)
# Inside core, the roles stack the same way: the base (the model, states, thresholds, redaction)
# imports nothing above it; `knowledge` (every rule type's schema and its loader) builds on the
# base; `state` (events, the window, leases, open operations: what is known of the server now)
# reads knowledge; `judge` (the classifier's stages and evaluators) reads all three. So an
# evaluator imports a schema, never the reverse.
CORE_ROLES = ("base", "knowledge", "state", "judge")
CONSTANT_NAME = re.compile(r"^_?[A-Z][A-Z0-9_]*$|^__\w+__$")


@dataclass(frozen=True)
class Edge:
    """One import: `module` (at `path:line`) imports `target`."""

    module: str
    target: str
    path: Path
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.module} imports {self.target}"


def module_files(root: Path) -> Iterator[tuple[str, Path]]:
    """(dotted name, path) of each module under the package directory `root`."""
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(rel.as_posix().startswith(s) for s in SKIPPED):
            continue
        parts = [root.name, *rel.with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


def layer(module: str) -> str:
    """`watchdog.core.state.window` -> core; `watchdog.config` -> config; `watchdog` -> watchdog."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def imports(module: str, path: Path, root: Path) -> Iterator[Edge]:
    """Every import of a module inside the package at `root`, relative ones resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    seen: set[tuple[str, int]] = set()
    for edge in _imports(module, package, path, root):
        if (edge.target, edge.line) not in seen:
            seen.add((edge.target, edge.line))
            yield edge


def _imports(module: str, package: str, path: Path, root: Path) -> Iterator[Edge]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == root.name:
                    yield Edge(module, alias.name, path, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            if source.split(".")[0] != root.name:
                continue
            for alias in node.names:  # `from watchdog.sources import gpu` imports a module
                sub = f"{source}.{alias.name}"
                is_module = _module_path(sub, root) is not None
                yield Edge(module, sub if is_module else source, path, node.lineno)


def _module_path(module: str, root: Path) -> Path | None:
    rel = Path(*module.split(".")[1:])
    for candidate in (root / rel.with_suffix(".py"), root / rel / "__init__.py"):
        if module.count(".") and candidate.is_file():
            return candidate
    return None


def core_role(module: str) -> str:
    """`watchdog.core.judge.classify` -> judge; `watchdog.core.model` -> base."""
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[2] in CORE_ROLES else "base"


def back_edges(root: Path) -> list[str]:
    """The imports that break the layer rule, one line each."""
    bad = []
    for module, path in module_files(root):
        here = layer(module)
        for edge in imports(module, path, root):
            there = layer(edge.target)
            if here == "core" and there != "core":
                bad.append(f"{edge} (core imports only core)")
            elif here == "core" and _above(core_role(edge.target), core_role(module)):
                bad.append(
                    f"{edge} (core's {core_role(module)} must not import its "
                    f"{core_role(edge.target)})"
                )
            elif there in FORBIDDEN.get(here, ()):
                bad.append(f"{edge} ({here} must not import {there})")
    return bad


def _above(there: str, here: str) -> bool:
    return CORE_ROLES.index(there) > CORE_ROLES.index(here)


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements, including those under a module-level if/try/with."""
    for stmt in body:
        if isinstance(stmt, ast.If | ast.Try | ast.With):
            yield from _top_level(stmt.body)
            yield from _top_level(getattr(stmt, "orelse", []))
            yield from _top_level(getattr(stmt, "finalbody", []))
            for handler in getattr(stmt, "handlers", []):
                yield from _top_level(handler.body)
        else:
            yield stmt


def _is_mutable(value: ast.expr | None) -> bool:
    if isinstance(value, ast.List | ast.Dict | ast.Set | ast.ListComp | ast.DictComp):
        return True
    if isinstance(value, ast.SetComp):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        return name in MUTABLE_CALLS
    return False


def _name_of(node: ast.expr) -> str | None:
    """`NAME` or `module.NAME` -> NAME."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def mutated_names(trees: list[ast.Module]) -> set[str]:
    """Names some code mutates in place, rebinds through `global`, or augments."""
    out: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                out.update(node.names)
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store | ast.Del):
                out.add(_name_of(node.value) or "")
            elif isinstance(node, ast.AugAssign):
                target = node.target.value if isinstance(node.target, ast.Subscript) else None
                out.add(_name_of(target or node.target) or "")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in MUTATORS
            ):
                out.add(_name_of(node.func.value) or "")
    out.discard("")
    return out


def mutable_globals(root: Path) -> list[str]:
    """Module-level mutable containers that are state: mutated somewhere, rebound through
    `global`, or named like a variable. An UPPER_CASE table nobody mutates is a constant."""
    parsed = [
        (m, p, ast.parse(p.read_text(encoding="utf-8"), str(p))) for m, p in module_files(root)
    ]
    mutated = mutated_names([tree for _, _, tree in parsed])
    bad = []
    for _, path, tree in parsed:
        for stmt in _top_level(tree.body):
            if not isinstance(stmt, ast.Assign | ast.AnnAssign) or not _is_mutable(stmt.value):
                continue
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for name in (t.id for t in targets if isinstance(t, ast.Name)):
                if name in mutated or not CONSTANT_NAME.match(name):
                    bad.append(f"{path}:{stmt.lineno}: module-level mutable {name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                bad.append(f"{path}:{node.lineno}: `global {', '.join(node.names)}`")
    return bad


def test_no_layer_imports_back_up_the_flow() -> None:
    assert back_edges(ROOT) == []


def test_no_module_level_mutable_state() -> None:
    assert mutable_globals(ROOT) == []


def test_the_scan_sees_the_whole_package() -> None:
    """A scan that found no modules (a moved root, a bad glob) would pass everything."""
    modules = dict(module_files(ROOT))
    assert {
        "watchdog.core.state.window",
        "watchdog.daemon.loop",
        "watchdog.outputs.incident",
    } <= set(modules)
    edges = [e.target for m, p in modules.items() for e in imports(m, p, ROOT)]
    assert "watchdog.core.model" in edges and "watchdog.sources.gpu.nvml" in edges


# The simulators are test fixtures that copy upstream programs' own shapes, cycles included.
CYCLES_ALLOWED = ("sim",)


def import_cycles(root: Path) -> list[list[str]]:
    """Groups of modules that import each other (directly or round a loop), lazy imports
    counted: each group is one strongly connected component of the import graph."""
    mods = {m: p for m, p in module_files(root) if layer(m) not in CYCLES_ALLOWED}
    graph = {
        m: sorted({e.target for e in imports(m, p, root)} & set(mods)) for m, p in mods.items()
    }
    reach = {m: _reachable(graph, m) for m in graph}
    groups = {tuple(sorted(n for n in reach[m] if m in reach[n])) for m in graph if m in reach[m]}
    return sorted(list(g) for g in groups)


def _reachable(graph: dict[str, list[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    return seen


def test_no_import_cycles() -> None:
    assert import_cycles(ROOT) == []


def test_a_planted_import_cycle_fails(tmp_path: Path) -> None:
    root = tmp_path / "watchdog"
    _plant(root, "core/a.py", "from watchdog.core.b import B\n")
    _plant(root, "core/b.py", "def f():\n    from watchdog.core import a\n")
    _plant(root, "core/c.py", "from watchdog.core import a\n")
    assert import_cycles(root) == [["watchdog.core.a", "watchdog.core.b"]]


def _plant(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    for parent in path.relative_to(root).parents:
        (root / parent / "__init__.py").touch()
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("rel", "text", "why"),
    [
        ("core/planted.py", "from watchdog.config import Config\n", "core imports only core"),
        ("core/planted.py", "def f():\n    from ..daemon import loop\n", "core imports only core"),
        ("core/planted.py", "from watchdog import __version__\n", "core imports only core"),
        (
            "outputs/planted.py",
            "import watchdog.sources.procs\n",
            "outputs must not import sources",
        ),
        ("remediation/planted.py", "from watchdog.daemon import loop\n", "must not import daemon"),
        ("sources/gpu/planted.py", "from ...outputs import emit\n", "must not import outputs"),
        ("knowledge.py", "from watchdog.daemon import loop\n", "must not import daemon"),
        ("knowledge.py", "def f():\n    from .outputs import emit\n", "must not import outputs"),
        ("configcheck.py", "from watchdog.config import Config\n", "must not import config"),
        ("configcheck.py", "from watchdog.knowledge import X\n", "must not import knowledge"),
        (
            "core/knowledge/planted.py",
            "from watchdog.core.state.window import Window\n",
            "core's knowledge must not import its state",
        ),
        (
            "core/state/planted.py",
            "def f():\n    from watchdog.core.judge import classify\n",
            "core's state must not import its judge",
        ),
        ("core/planted.py", "from .knowledge import x\n", "core's base must not import"),
    ],
)
def test_a_planted_back_edge_fails(tmp_path: Path, rel: str, text: str, why: str) -> None:
    root = tmp_path / "watchdog"
    for real in (
        "config.py",
        "__init__.py",
        "daemon/loop.py",
        "sources/procs.py",
        "outputs/emit.py",
        "knowledge.py",
        "core/state/window.py",
        "core/judge/classify.py",
        "core/knowledge/x.py",
    ):
        _plant(root, real, "")
    path = _plant(root, rel, text)
    bad = back_edges(root)
    assert len(bad) == 1 and bad[0].startswith(f"{path}:") and why in bad[0], bad


def test_a_planted_mutable_global_fails(tmp_path: Path) -> None:
    root = tmp_path / "watchdog"
    _plant(root, "core/tables.py", "NAMES = {'a': 1}\n_CACHE: dict = {}\nseen = []\n")
    _plant(root, "core/user.py", "from watchdog.core.tables import _CACHE\n_CACHE['k'] = 2\n")
    _plant(root, "core/counter.py", "N = 0\ndef bump():\n    global N\n    N += 1\n")
    bad = mutable_globals(root)
    assert [b.split(": ", 1)[1] for b in bad] == [
        "`global N`",
        "module-level mutable _CACHE",
        "module-level mutable seen",
    ], bad
