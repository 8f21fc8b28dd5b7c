"""benchmarks/machine.py, the calibration every benchmark prints, and that every benchmark script uses it."""

from __future__ import annotations

import ast
import importlib.util
import io
import json
import math
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"


def _machine() -> ModuleType:
    spec = importlib.util.spec_from_file_location("machine", BENCHMARKS / "machine.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def machine() -> ModuleType:
    return _machine()


@pytest.fixture(scope="module")
def cal(machine: ModuleType) -> dict:
    return machine.calibrate(repeats=1)


def test_calibrate_gives_positive_finite_units_and_a_json_record(machine: ModuleType, cal: dict) -> None:
    for kind in machine.KINDS:
        assert math.isfinite(cal[kind + "_s"]) and cal[kind + "_s"] > 0
    assert cal["repeats"] == 1
    assert cal["cpus"] is None or cal["cpus"] >= 1
    assert json.loads(json.dumps(cal)) == cal  # goes into the benchmarks' JSON as is
    with pytest.raises(ValueError, match="repeats"):
        machine.calibrate(repeats=0)


def test_workloads_are_fixed(machine: ModuleType) -> None:
    ints, floats = machine.numpy_inputs(1000)
    again = machine.numpy_inputs(1000)
    assert (ints == again[0]).all() and (floats == again[1]).all()
    assert machine.numpy_workload(ints, floats, passes=2) == machine.numpy_workload(*again, passes=2)
    assert machine.python_workload(5000) == machine.python_workload(5000)
    assert machine.python_workload(5000) != machine.python_workload(5001)


def test_print_calibration_is_one_line_of_the_measured_units(machine: ModuleType, cal: dict) -> None:
    out = io.StringIO()
    machine.print_calibration(cal, out)
    line = out.getvalue()
    assert line.count("\n") == 1 and line.startswith("machine: ")
    assert f"python workload {cal['python_s'] * 1e3:.0f} ms" in line
    assert f"numpy workload {cal['numpy_s'] * 1e3:.0f} ms" in line
    assert f"best of {cal['repeats']}" in line


def test_ratios_are_consistent(machine: ModuleType, cal: dict) -> None:
    assert machine.relative(2 * cal["numpy_s"], cal) == pytest.approx(2.0)
    assert machine.relative(3 * cal["python_s"], cal, "python") == pytest.approx(3.0)
    for kind in machine.KINDS:
        n, t = 12_345, 0.37 * cal[kind + "_s"] + 0.01
        # n items in t seconds: n per (t in units) is the rate in items per unit
        assert machine.rate_relative(n / t, cal, kind) == pytest.approx(n / machine.relative(t, cal, kind))
        assert machine.rate_relative(1 / cal[kind + "_s"], cal, kind) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="kind"):
        machine.relative(1.0, cal, "gpu")


def test_timing_figures_read_the_keys(machine: ModuleType, cal: dict) -> None:
    u = cal["python_s"]
    figures = {"single_reports_per_s": 3000, "reports_per_s_local1": 10.0, "close_seconds": 2.0,
               "max_lock_hold_s": 0.5, "p99_ms": 40.0, "verify_us_local": 90.0, "seconds_local1": 4.0,
               "cpus": 2, "rss_before_publish_mb": 300, "targets_met": True, "first_error": None,
               "batch_server_cpu_us": None, "db": "sqlite"}
    got = machine.timing_figures(figures, cal, "python")
    expected = {"single_reports_per_s": 3000 * u, "reports_per_s_local1": 10.0 * u, "close_seconds": 2.0 / u,
                "max_lock_hold_s": 0.5 / u, "p99_ms": 0.040 / u, "verify_us_local": 90e-6 / u,
                "seconds_local1": 4.0 / u}
    assert got.keys() == expected.keys()
    for k, v in expected.items():
        assert got[k] == pytest.approx(v, rel=1e-3)
    assert machine.unit_label("single_reports_per_s", 12.0, "python") == "12 per python unit"
    assert machine.unit_label("close_seconds", 12.0, "numpy") == "12 numpy units"
    assert machine.in_units(cal, "numpy", {"t": 2 * cal["numpy_s"], "none": None},
                            {"r": 5 / cal["numpy_s"]}) == {"t": 2.0, "none": None, "r": 5.0}


# ----- every benchmark script calibrates ---------------------------------------------------------------


def calibrate_calls(tree: ast.Module) -> list[ast.Call]:
    """The calls in ``tree`` of benchmarks/machine.py's ``calibrate`` (imported with ``from machine import
    calibrate [as x]``, or ``import machine [as m]`` then ``m.calibrate(...)``); another ``calibrate`` is not one."""
    names, modules = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "machine" and node.level == 0:
            names |= {a.asname or a.name for a in node.names if a.name == "calibrate"}
        elif isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name == "machine"}
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call) and (
        (isinstance(node.func, ast.Name) and node.func.id in names)
        or (isinstance(node.func, ast.Attribute) and node.func.attr == "calibrate"
            and isinstance(node.func.value, ast.Name) and node.func.value.id in modules))]


def parse_args_lines(tree: ast.Module) -> list[int]:
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr == "parse_args"]


def sibling_imports(tree: ast.Module) -> set[str]:
    """The benchmarks/ modules a file imports (``from x import ...`` / ``import x`` with x a file in benchmarks/)."""
    local = {p.stem for p in BENCHMARKS.glob("*.py")}
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in local:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in local}
    return out


def test_calibrate_calls_are_found_only_for_machines_calibrate() -> None:
    assert len(calibrate_calls(ast.parse("from machine import calibrate\ncalibrate()\n"))) == 1
    assert len(calibrate_calls(ast.parse("from machine import calibrate as c\nc(repeats=3)\n"))) == 1
    assert len(calibrate_calls(ast.parse("import machine as m\nm.calibrate()\n"))) == 1
    assert not calibrate_calls(ast.parse("from machine import calibrate\n"))
    assert not calibrate_calls(ast.parse("from hybriddp.server.calibration import calibrate\ncalibrate(1)\n"))
    assert not calibrate_calls(ast.parse("import machine\nother.calibrate()\n"))


def test_every_benchmark_script_calibrates_after_parsing_its_arguments() -> None:
    trees = {p.name: ast.parse(p.read_text(encoding="utf-8")) for p in sorted(BENCHMARKS.glob("*.py"))}
    assert len(trees) >= 10, "benchmarks/ not found"
    helpers = {m + ".py" for tree in trees.values() for m in sibling_imports(tree)}
    assert "machine.py" in helpers
    scripts = {name: tree for name, tree in trees.items() if name not in helpers}
    assert len(scripts) >= 10
    missing = [name for name, tree in scripts.items() if not calibrate_calls(tree)]
    assert not missing, f"benchmarks that print no calibration of their machine: {missing}"
    for name, tree in scripts.items():
        # --help answers before the calibration: the arguments are parsed first
        first = min(c.lineno for c in calibrate_calls(tree))
        assert all(line < first for line in parse_args_lines(tree)), name
    for name in helpers - {"machine.py"}:  # a helper is no benchmark: it has no __main__ of its own
        assert "__main__" not in ast.unparse(trees[name]), f"{name} is run as a script: it must calibrate"
