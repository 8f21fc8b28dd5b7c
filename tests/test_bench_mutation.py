"""benchmarks/bench_mutation.py's bookkeeping: statuses, the score, and what --rerun-survivors re-tests."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    spec = importlib.util.spec_from_file_location("bench_mutation", ROOT / "benchmarks" / "bench_mutation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_score_counts_every_mutant_and_rerun_resets_only_the_not_killed(tmp_path: Path) -> None:
    bench = _bench()
    meta = tmp_path / "mutants" / "src" / "hybriddp" / "server" / "blend.py.meta"
    meta.parent.mkdir(parents=True)
    codes = {"a": 1, "b": 3, "c": 36, "d": 0, "e": 33, "f": None, "g": 35, "h": -9}
    meta.write_text(json.dumps({"exit_code_by_key": codes, "other": {"kept": True}}), encoding="utf-8")
    results = bench.read_results(tmp_path)
    assert results == {"server/blend.py": {"a": "killed", "b": "killed", "c": "timeout", "d": "survived",
                                           "e": "no tests", "f": "not checked", "g": "suspicious", "h": "segfault"}}
    row = bench.score_table(results)["total"]
    # 3 of 8 caught; survived and no tests have their columns, the rest is "other"
    assert row == {"mutants": 8, "killed": 2, "timeout": 1, "survived": 1, "no_tests": 1, "other": 3,
                   "score": 3 / 8}
    # d, e, g, h ("f" already null)
    assert bench.reset_survivors(["server/blend.py", "curator/mechanisms.py"], tmp_path) == 4
    data = json.loads(meta.read_text(encoding="utf-8"))
    assert data["exit_code_by_key"] == {"a": 1, "b": 3, "c": 36, "d": None, "e": None, "f": None, "g": None,
                                        "h": None}
    assert data["other"] == {"kept": True}
