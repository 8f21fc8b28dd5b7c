"""Which algorithm code made a stored run: a fingerprint per run family, blind to docstrings.

``trials.csv`` is resumed across invocations; a row made by an older version of an algorithm
must not be mixed with new ones. Every row therefore records the fingerprint of the code its
family ran, and a row whose fingerprint differs from today's is run again.

The fingerprint of a family is a SHA-256 over the *code* of every hybriddp module its runs can
execute: the transitive closure of ``hybriddp`` imports (module level and inside functions) from
the family's roots (:data:`FAMILY_ROOTS`), with the command line and the experiment framework
(reports, plots, claims) left out unless a root names them. Each module is parsed and dumped
without docstrings, comments or layout, so editing documentation never invalidates results,
while any change to what the code does (a constant, a condition, a default) does.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
from pathlib import Path

FAMILY_ROOTS: dict[str, tuple[str, ...]] = {
    "blender": ("hybriddp.simulation.algorithms",),
    "blender-reuse": ("hybriddp.simulation.algorithms",),
    "local-only": ("hybriddp.simulation.algorithms",),
    "local-only-hashed": ("hybriddp.simulation.algorithms",),
    "blender-tuned": ("hybriddp.simulation.algorithms", "hybriddp.tune", "hybriddp.experiments.tuned"),
}
"""Where each family's code starts (``hybriddp.simulation.algorithms`` reaches the pipeline, the baselines,
the metrics and the scoring)."""

EXCLUDED_PREFIXES = ("hybriddp.cli", "hybriddp.experiments")
"""Packages whose modules count only when a root names them (presentation, not algorithms)."""


def normalized_code(source: str) -> bytes:
    """The AST of ``source`` without docstrings or other bare string statements, as bytes."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            kept = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                            and isinstance(s.value.value, str))]
            node.body = kept or [ast.Pass()]
    return ast.dump(tree, include_attributes=False).encode()


def _origin(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec is not None and spec.origin and spec.origin.endswith(".py") else None


def _imports(tree: ast.AST) -> set[str]:
    """``hybriddp`` modules named by the imports anywhere in ``tree`` (``from m import x``: m and m.x)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("hybriddp")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("hybriddp"):
            out.add(node.module or "")
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def module_closure(roots: tuple[str, ...]) -> dict[str, Path]:
    """Module name → source file of every hybriddp module reachable from ``roots`` by imports."""
    seen: dict[str, Path] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen or (name not in roots and name.startswith(EXCLUDED_PREFIXES)):
            continue
        path = _origin(name)
        if path is None:  # ``from m import x`` where x is not a module
            continue
        seen[name] = path
        parent = name.rpartition(".")[0]  # importing a.b.c runs a/b/__init__.py first
        todo += sorted((_imports(ast.parse(path.read_text(encoding="utf-8"))) | {parent}) - set(seen) - {""})
    return seen


@functools.cache
def family_fingerprint(family: str) -> str:
    """12 hex digits identifying the code a run of ``family`` executes (module docstring)."""
    h = hashlib.sha256()
    for name, path in sorted(module_closure(FAMILY_ROOTS[family]).items()):
        h.update(name.encode() + b"\0" + normalized_code(path.read_text(encoding="utf-8")) + b"\0")
    return h.hexdigest()[:12]
