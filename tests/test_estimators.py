"""The estimator registry (hybriddp.core.estimators): one definition of each ``--estimator`` name, rendered
everywhere it is offered, and no other module deciding anything by comparing estimator names.

* Every registered estimator has a :class:`Release` (the curator's decision, ALGORITHM.md §3.3, §4.1), a
  :class:`Blend` (the server's, §7, §7.1) with a strategy in ``hybriddp.server.blend``, a summary and a help text.
* The CLI's ``--estimator`` choices and help, the service schema's ``Literal`` and the result summary are the
  registry's.
* An AST scan of src/hybriddp finds no comparison with a literal estimator name and no literal re-listing the
  names outside core/estimators.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from hybriddp.core.errors import ParameterError
from hybriddp.core.estimators import (
    DEFAULT_ESTIMATOR,
    ESTIMATORS,
    LEGACY_ESTIMATOR,
    REGISTRY,
    Blend,
    Release,
    describe_estimators,
    estimator_named,
)
from hybriddp.core.params import BlenderParams

SRC = Path(__file__).resolve().parents[1] / "src" / "hybriddp"
REGISTRY_FILE = SRC / "core" / "estimators.py"


# --------------------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------------------

def test_every_estimator_has_a_release_a_blend_and_an_explanation() -> None:
    assert ESTIMATORS == tuple(REGISTRY) == ("paper", "pooled", "reuse", "consistent")
    for name, e in REGISTRY.items():
        assert e.name == name
        assert isinstance(e.release, Release) and isinstance(e.blend, Blend)
        assert e.summary.strip() and e.help.strip(), name
        assert "ALGORITHM.md §" in e.help or "Fig. 7" in e.help, f"{name}: the help names no section"
    assert {e.release for e in REGISTRY.values()} == set(Release)
    assert {e.blend for e in REGISTRY.values()} == set(Blend)
    assert DEFAULT_ESTIMATOR in REGISTRY and LEGACY_ESTIMATOR in REGISTRY


def test_the_two_decisions_of_each_estimator() -> None:
    """paper and pooled make the paper's opt-in estimates (T alone); reuse and consistent release S's counts
    (ALGORITHM.md §4.1). Blends: Fig. 7, pooled (§7), pooled (§7), consistent (§7.1)."""
    got = {name: (e.release, e.blend) for name, e in REGISTRY.items()}
    assert got == {"paper": (Release.PAPER, Blend.PAPER), "pooled": (Release.PAPER, Blend.POOLED),
                   "reuse": (Release.REUSE_S, Blend.POOLED), "consistent": (Release.REUSE_S, Blend.CONSISTENT)}
    assert [n for n, e in REGISTRY.items() if e.reuses_s] == ["reuse", "consistent"]
    assert REGISTRY["reuse"].alternatives() == ("reuse", "consistent")
    assert REGISTRY["paper"].alternatives() == ("paper", "pooled")


def test_an_unknown_name_is_refused_with_the_choices() -> None:
    for bad in ("median", "", None, ["paper"], "Paper"):
        with pytest.raises(ParameterError, match="paper or pooled or reuse or consistent"):
            estimator_named(bad)
    with pytest.raises(ParameterError, match=r"estimator \(--estimator\)"):
        BlenderParams(estimator="median")


def test_params_expose_the_spec() -> None:
    assert BlenderParams().estimator_spec is REGISTRY[DEFAULT_ESTIMATOR]
    for name in ESTIMATORS:
        assert BlenderParams(estimator=name).estimator_spec is REGISTRY[name]


def test_every_blend_has_a_server_strategy() -> None:
    from hybriddp.server.blend import STRATEGIES, blend_pooled
    from hybriddp.server.consistency import make_consistent

    assert set(STRATEGIES) == set(Blend)
    assert STRATEGIES[Blend.PAPER] == ()
    assert STRATEGIES[Blend.POOLED] == (blend_pooled,)
    assert STRATEGIES[Blend.CONSISTENT] == (blend_pooled, make_consistent)


def test_blending_by_name_is_blending_by_the_named_strategy() -> None:
    from hybriddp.core.reportlaw import LocalAlgParams
    from hybriddp.server.blend import blend_estimates, blend_strategy
    from hybriddp.server.calibration import draw_rounds, six_queries

    hl, p = six_queries()
    lp = LocalAlgParams.build(hl, 4.0, 1e-5, 0.85, 1)
    (opt,), (cli,) = draw_rounds(hl, p, lp, n_t=300, n_s=2000, n_c=5000, epsilon=4.0, trials=1,
                                 rng=np.random.default_rng(3))
    for name, e in REGISTRY.items():
        a = blend_estimates(opt, cli, estimator=name, lp=lp)
        b = blend_strategy(e.blend, opt, cli, lp=lp)
        assert a.records.p.tolist() == b.records.p.tolist() and a.queries.var.tolist() == b.queries.var.tolist()
    with pytest.raises(ValueError, match="LocalAlg"):
        blend_strategy(Blend.CONSISTENT, opt, cli)


# --------------------------------------------------------------------------------------
# Rendered from the registry: the CLI, the service schema, the result summary
# --------------------------------------------------------------------------------------

def test_the_cli_offers_the_registry() -> None:
    from hybriddp.cli import cli

    offered = 0
    for name, command in cli.commands.items():
        commands = command.commands.values() if hasattr(command, "commands") else [command]
        for cmd in commands:
            for opt in cmd.params:
                if "--estimator" in getattr(opt, "opts", ()):
                    offered += 1
                    assert tuple(opt.type.choices) == ESTIMATORS, name
                    assert opt.help.startswith(describe_estimators()), name
                    assert f"Default: {DEFAULT_ESTIMATOR}" in opt.help
    assert offered >= 5  # demo, run, headlist, estimate, tune, round create


def test_the_service_schema_offers_the_registry() -> None:
    from hybriddp.service.models import BlenderParamsIn

    field = BlenderParamsIn.model_json_schema()["properties"]["estimator"]
    assert field["enum"] == list(ESTIMATORS)
    assert field["default"] == DEFAULT_ESTIMATOR
    assert all(e.help in field["description"] for e in REGISTRY.values())
    for name in ESTIMATORS:
        assert BlenderParamsIn(estimator=name).estimator == name
    with pytest.raises(ValueError):
        BlenderParamsIn(estimator="median")


def test_the_summary_line_is_the_registrys(capsys: pytest.CaptureFixture[str]) -> None:
    from dataclasses import replace

    from hybriddp.cli.render import print_summary
    from hybriddp.simulation.pipeline import run_blender
    from logdata import zipf_log

    log = zipf_log(n_users=3000, seed=1)
    params = BlenderParams(epsilon=4.0, optin_fraction=0.3, head_list_size=10)
    for name, e in REGISTRY.items():
        print_summary(run_blender(log, replace(params, estimator=name), seed=2).result())
        assert f"estimator: {name} — {e.summary}" in capsys.readouterr().out


# --------------------------------------------------------------------------------------
# No string comparison of estimator names outside the registry
# --------------------------------------------------------------------------------------

NAMES = frozenset(ESTIMATORS)


def _names_in(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in NAMES}


def estimator_name_decisions(source: str) -> list[tuple[int, str]]:
    """(line, what) for every comparison with a literal estimator name (``==``, ``!=``, ``in``, ``not in``, a
    ``case``), and every literal tuple, list, set or dict that lists two or more estimator names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and (names := _names_in(node)):
            found.append((node.lineno, f"compares with {sorted(names)}"))
        elif isinstance(node, ast.MatchValue) and (names := _names_in(node)):
            found.append((node.lineno, f"matches {sorted(names)}"))
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(names := _names_in(node)) >= 2:
            found.append((node.lineno, f"lists {sorted(names)}"))
        elif isinstance(node, ast.Dict) and len(names := set().union(*map(_names_in, filter(None, node.keys)))) >= 2:
            found.append((node.lineno, f"maps {sorted(names)}"))
    return found


def test_no_module_decides_by_an_estimator_name() -> None:
    offenders = [f"{path.relative_to(SRC.parent)}:{line}: {what}"
                 for path in sorted(SRC.rglob("*.py")) if path != REGISTRY_FILE
                 for line, what in estimator_name_decisions(path.read_text(encoding="utf-8"))]
    assert not offenders, "ask the registry (hybriddp.core.estimators) instead:\n" + "\n".join(offenders)


@pytest.mark.parametrize("code", [
    'if estimator == "consistent":\n    pass',
    'if params.estimator != "paper":\n    pass',
    'reuse = estimator in ("reuse", "consistent")',
    'done = "reuse" in seen',
    'match e:\n    case "pooled":\n        pass',
    'REUSES_S = frozenset({"reuse", "consistent"})',
    'NOTES = {"paper": "a", "pooled": "b"}',
    'x: Literal["paper", "pooled", "reuse", "consistent"] = "reuse"',
])
def test_the_scan_catches_a_name_decision(code: str) -> None:
    assert estimator_name_decisions(code)


@pytest.mark.parametrize("code", [
    'params = BlenderParams(estimator="paper")',
    'run = reblended(run, "consistent")',
    'row = {"figure": f, "paper": p, "here": h}',
    'if algorithm == "blender-pooled":\n    pass',
])
def test_the_scan_lets_names_as_arguments_pass(code: str) -> None:
    assert not estimator_name_decisions(code)
