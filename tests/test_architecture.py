"""The layering of src/hybriddp, read from the code's own imports (docs/ARCHITECTURE.md).

Every ``import`` and ``from … import`` of a hybriddp module counts, wherever it stands (module level,
inside a function, under ``if TYPE_CHECKING``): a lazy import is still a dependency. The rules:

* no import cycle between modules;
* no upward import: a package imports only from its own layer or below (:data:`LAYERS`);
* the three parties (curator, device, server) import nothing of each other except the curator's
  published interface (:data:`PARTY_INTERFACES`): the server reads the curator's release, never its
  mechanisms.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "hybriddp"

LAYERS: dict[str, int] = {
    "core": 0,
    "io": 1,
    "privacy": 2,
    "mean": 3,
    "curator": 4, "device": 4, "server": 4,
    "simulation": 5, "datasets": 5, "spark": 5, "sdk": 5, "audit": 5, "tune": 5,
    "service": 6, "relay": 6, "forwarder": 6,
    "experiments": 7,
    "cli": 8,
    "__init__": 9, "__main__": 9, "parties": 9, "client": 9, "pipeline": 9,  # the face and deprecated aliases
}
"""Layer of each top-level package (or module) of hybriddp, bottom first."""

PARTIES = ("curator", "device", "server")
PARTY_INTERFACES = {"hybriddp.curator.release", "hybriddp.curator.estimates"}
"""What one party may import of another: the curator's published documents and their estimates."""


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SRC.rglob("*.py")) if "migrations" not in p.parts}


def imports(path: Path, name: str) -> set[str]:
    """The hybriddp modules ``path`` imports (``from hybriddp.x import y`` counts as hybriddp.x.y when that
    is a module, else hybriddp.x)."""
    known = modules()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("hybriddp"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # a relative import: from the package, up node.level - 1 packages
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            if not base.startswith("hybriddp"):
                continue
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return {m for m in out if m in known and m != name}


def top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


GRAPH = {name: imports(path, name) for name, path in modules().items()}


def test_every_package_has_a_layer() -> None:
    assert {top(m) for m in GRAPH} <= set(LAYERS), sorted({top(m) for m in GRAPH} - set(LAYERS))


def test_no_upward_import() -> None:
    upward = sorted(f"{a} -> {b}" for a, deps in GRAPH.items() for b in deps if LAYERS[top(b)] > LAYERS[top(a)])
    assert upward == []


def test_parties_use_only_each_others_published_interface() -> None:
    crossing = sorted(f"{a} -> {b}" for a, deps in GRAPH.items() for b in deps
                      if top(a) in PARTIES and top(b) in PARTIES and top(a) != top(b) and b not in PARTY_INTERFACES)
    assert crossing == []


def test_no_import_cycle() -> None:
    """Tarjan's strongly connected components: every component is a single module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # recursion depth is bounded by the number of modules (~150)
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert cycles == []


@pytest.mark.parametrize("bad", ["core -> curator", "curator -> service", "server -> curator.mechanisms"])
def test_the_rules_catch_a_bad_import(bad: str, tmp_path: Path) -> None:
    """The checks are not vacuous: each rule flags an import that breaks it."""
    a, b = bad.split(" -> ")
    source, target = f"hybriddp.{a}.x" if "." not in a else f"hybriddp.{a}", f"hybriddp.{b}"
    graph = {source: {target}}
    if bad.startswith("server"):
        assert top(target) in PARTIES and target not in PARTY_INTERFACES and top(source) != top(target)
    else:
        assert any(LAYERS[top(t)] > LAYERS[top(s)] for s, deps in graph.items() for t in deps)


@pytest.mark.parametrize(("alias", "name", "home"), [
    ("hybriddp.client", "AdminClient", "hybriddp.sdk"),
    ("hybriddp.parties", "curate", "hybriddp.curator.party"),
    ("hybriddp.pipeline", "run_blender", "hybriddp.simulation.pipeline"),
])
def test_moved_public_names_keep_a_deprecated_alias(alias: str, name: str, home: str) -> None:
    import importlib
    import sys

    sys.modules.pop(alias, None)
    with pytest.warns(DeprecationWarning, match=alias):
        module = importlib.import_module(alias)
    assert getattr(module, name) is getattr(importlib.import_module(home), name)


def test_the_package_face_exposes_the_three_parties() -> None:
    import hybriddp
    from hybriddp.curator.party import curate
    from hybriddp.device.party import device_message
    from hybriddp.server.party import serve_estimates
    from hybriddp.simulation.pipeline import run_blender

    assert (hybriddp.curate, hybriddp.device_message, hybriddp.serve_estimates, hybriddp.run_blender) == (
        curate, device_message, serve_estimates, run_blender)
