"""Mutation testing's test selection (pyproject.toml ``[tool.mutmut]``, docs/TESTING.md) covers every mutated module.

mutmut runs each mutant only against the selected tests that reach its function; a module no selected test
imports has all its mutants reported as "no tests". These checks read the configuration and the test files'
imports (with ``ast``: no test file is imported or run, nor mutmut), so they fail as soon as a module is added
to ``only_mutate`` without a selected test importing it, or a selected test file or deselected test is renamed
or removed.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from functools import cache
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser as the tomli package (the test extra installs it there)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
EXCLUDED_DIRS = ("service", "browser", "spark", "interop", "js")
"""tests/ subdirectories that need PostgreSQL, Chromium, Spark, Node or a running server."""
OPTIONS_WITH_VALUE = {"--deselect", "-k", "-m", "--ignore", "--ignore-glob"}


def mutmut_config() -> dict[str, Any]:
    """The ``[tool.mutmut]`` table of pyproject.toml."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["tool"]["mutmut"]


def parse_selection(args: list[str]) -> tuple[list[str], list[str]]:
    """(test paths, deselected node ids) of a pytest argument list; a path may carry a ``::test`` suffix."""
    paths: list[str] = []
    deselected: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--deselect="):
            deselected.append(arg.split("=", 1)[1])
        elif arg in OPTIONS_WITH_VALUE:
            if arg == "--deselect":
                deselected.append(args[i + 1])
            i += 1
        elif not arg.startswith("-"):
            paths.append(arg)
        i += 1
    return paths, deselected


def module_file(dotted: str, src: Path = SRC) -> Path | None:
    """src/a/b.py for ``a.b`` when that module file exists (packages and names that are not modules: None)."""
    path = src.joinpath(*dotted.split(".")).with_suffix(".py")
    return path if path.is_file() else None


def absolute_module(node: ast.ImportFrom, importer: Path, src: Path = SRC) -> str | None:
    """The dotted module of ``from <module> import ...`` in ``importer`` (a file under src/), relative ones too."""
    if node.level == 0:
        return node.module
    package = importer.relative_to(src).with_suffix("").parts[:-1]
    if node.level - 1 > len(package):
        return None
    base = list(package[: len(package) - (node.level - 1)])
    return ".".join(base + ([node.module] if node.module else []))


@cache
def defining_module(module: Path, name: str, src: Path = SRC, depth: int = 0) -> Path:
    """The module file that defines ``name`` as seen from ``module``: ``module`` itself, or, when ``module``
    takes it by a top-level ``from hybriddp... import name`` (a re-export), the module it comes from."""
    if depth > 10:
        return module
    for node in ast.parse(module.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom):
            source = absolute_module(node, module, src)
            if source is None or not source.startswith("hybriddp"):
                continue
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    origin = module_file(source, src)
                    return defining_module(origin, alias.name, src, depth + 1) if origin else module
    return module


@cache
def imported_modules(test_file: Path, src: Path = SRC) -> frozenset[Path]:
    """The src/hybriddp module files a test file imports anywhere in it: ``import hybriddp.x.y``,
    ``from hybriddp.x.y import z`` (x/y.py, and the module defining ``z`` if x/y.py re-exports it) and
    ``from hybriddp.x import y`` with ``y`` a module (x/y.py)."""
    found: set[Path] = set()
    for node in ast.walk(ast.parse(test_file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(f for alias in node.names if alias.name.startswith("hybriddp")
                         and (f := module_file(alias.name, src)) is not None)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("hybriddp"):
            assert node.module is not None
            parent = module_file(node.module, src)
            if parent is not None:
                found.add(parent)
            for alias in node.names:
                submodule = module_file(f"{node.module}.{alias.name}", src)
                if submodule is not None:
                    found.add(submodule)
                elif parent is not None:
                    found.add(defining_module(parent, alias.name, src))
    return frozenset(found)


def test_every_selected_test_file_exists_and_is_a_fast_unit_test() -> None:
    paths, _ = parse_selection(mutmut_config()["pytest_add_cli_args_test_selection"])
    assert paths, "[tool.mutmut] pytest_add_cli_args_test_selection lists no test file"
    for entry in paths:
        path = ROOT / entry.split("::")[0]
        assert path.is_file(), (f"{entry} in [tool.mutmut] pytest_add_cli_args_test_selection does not exist: "
                                "point it at the file that now holds those tests, or remove it")
        parts = path.relative_to(ROOT / "tests").parts
        assert len(parts) == 1 or parts[0] not in EXCLUDED_DIRS, (
            f"{entry}: tests/{parts[0]} needs an external service; mutation testing selects fast unit tests only")


def test_every_deselected_test_exists() -> None:
    """A deselected node id that no longer names a test would silently put a slow test back in the selection."""
    _, deselected = parse_selection(mutmut_config()["pytest_add_cli_args_test_selection"])
    for node_id in deselected:
        file, _, qualname = node_id.partition("::")
        path = ROOT / file
        assert path.is_file(), f"--deselect {node_id}: {file} does not exist; update or drop the --deselect"
        names = {n.name for n in ast.parse(path.read_text(encoding="utf-8")).body
                 if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
        assert qualname.split("::")[0].split("[")[0] in names, (
            f"--deselect {node_id}: no such test in {file}; update or drop the --deselect in [tool.mutmut]")


def test_every_mutated_module_is_imported_by_a_selected_test_file() -> None:
    config = mutmut_config()
    paths, _ = parse_selection(config["pytest_add_cli_args_test_selection"])
    files = {ROOT / entry.split("::")[0] for entry in paths}
    covered = set().union(*(imported_modules(f) for f in files if f.is_file()))
    missing = [m for m in config["only_mutate"] if (ROOT / m).resolve() not in covered]
    absent = [m for m in missing if not (ROOT / m).is_file()]
    assert not absent, f"[tool.mutmut] only_mutate lists modules that do not exist: {absent}"
    assert not missing, (
        f"no test file in [tool.mutmut] pytest_add_cli_args_test_selection imports {', '.join(missing)}: all their "
        "mutants would have no tests. Add the fast unit test file(s) under tests/ that import and exercise them.")


def test_the_mutation_benchmark_reports_exactly_the_mutated_modules() -> None:
    spec = importlib.util.spec_from_file_location("bench_mutation", ROOT / "benchmarks" / "bench_mutation.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    only_mutate = {m.removeprefix("src/hybriddp/") for m in mutmut_config()["only_mutate"]}
    assert set(bench.MODULES) == only_mutate, (
        "benchmarks/bench_mutation.py MODULES and [tool.mutmut] only_mutate differ: "
        f"only in MODULES {sorted(set(bench.MODULES) - only_mutate)}, "
        f"only in only_mutate {sorted(only_mutate - set(bench.MODULES))}")
    for module, prefix in bench.MODULES.items():
        assert prefix == "hybriddp." + module.removesuffix(".py").replace("/", "."), (module, prefix)


def test_the_import_resolution_finds_direct_and_re_exported_modules(tmp_path: Path) -> None:
    """The resolution above, on a source tree and a test file written here: each import form maps to its module
    file, a re-exported name (absolute or relative re-export, also in two steps) to the module defining it too,
    and packages, other names and other libraries to nothing."""
    pkg = tmp_path / "src" / "hybriddp"
    files = {"core/a.py": "X = 1\n", "core/b.py": "from hybriddp.core.a import X as Y\n",
             "core/c.py": "from .b import Y\nZ = 2\n", "core/d.py": "", "core/__init__.py": "",
             "server/e.py": "", "server/f.py": "", "server/__init__.py": "", "__init__.py": ""}
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text, encoding="utf-8")
    test_file = tmp_path / "test_forms.py"
    test_file.write_text("import hybriddp.core.d\n"
                         "import hybriddp.core\n"
                         "from hybriddp.server import e\n"
                         "from hybriddp.core.c import Y, Z\n"
                         "import numpy\n"
                         "def test_x():\n"
                         "    from hybriddp.server.f import anything\n", encoding="utf-8")
    got = {p.relative_to(pkg).as_posix() for p in imported_modules(test_file, tmp_path / "src")}
    assert got == {"core/d.py", "server/e.py", "core/c.py", "core/a.py", "server/f.py"}
    assert parse_selection(["a.py", "--deselect", "a.py::t", "-k", "not b", "--deselect=c.py::u", "d.py::v"]) == (
        ["a.py", "d.py::v"], ["a.py::t", "c.py::u"])
