"""The repository explains its own algorithms: docs/ALGORITHM.md and what cites it.

* Every "ALGORITHM.md §N" (or §N.M) cited in the code, the tests, the benchmarks and the docs names
  a section heading that exists in docs/ALGORITHM.md, whose top-level sections are §1 … §12.
* Nothing in the repository points outside it: no file mentions the specification or the shared
  folder that lived beside the repository while it was written (a clone has neither). The one
  exception is listed in :data:`EXCLUDED`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ALGORITHM = ROOT / "docs" / "ALGORITHM.md"

# Built from pieces so that this file does not contain what it forbids.
FORBIDDEN = {
    "the old specification file": re.compile(re.escape("SP" + "EC.md")),
    "a section of the old specification": re.compile(r"\b" + "SP" + r"EC\b"),
    "the shared folder beside the repository": re.compile(re.escape("../" + "shared")),
    "the shared folder's absolute path": re.compile(re.escape("/work/" + "shared")),
    "the data sets' provenance file outside the repository": re.compile(re.escape("PROVEN" + "ANCE.md")),
}

EXCLUDED = {
    "docs/results": "generated experiment reports (report.md, figN.csv, summary.json) and the notes on "
                    "how they were made: they record the dataset paths the runs were given",
}
"""Paths (relative to the repository root) that test (b) does not scan, with the reason."""

SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".hypothesis"}
"""Caches and build output: not part of the repository (``*.egg-info`` is skipped too)."""

CITATION = re.compile(
    r"ALGORITHM\.md(?:[\s#*\"'`]*)"  # the name, possibly wrapped onto the next (comment) line
    r"(§\s*\d+(?:\.\d+)?(?:\s*(?:,|/|–|-|and|or)\s*§\s*\d+(?:\.\d+)?)*)"
)
SECTION = re.compile(r"§\s*(\d+(?:\.\d+)?)")
HEADING = re.compile(r"^(#{2,3}) (\d+(?:\.\d+)?)\.? ", re.MULTILINE)


def _skipped(path: Path) -> bool:
    parts = path.relative_to(ROOT).parts
    return any(p in SKIPPED_DIRS or p.endswith(".egg-info") for p in parts)


def _excluded(path: Path) -> bool:
    rel = path.relative_to(ROOT).as_posix()
    return any(rel == e or rel.startswith(e + "/") for e in EXCLUDED)


def scanned_files() -> list[Path]:
    """src/, tests/, benchmarks/ (every file), README.md, PRIVACY.md and docs/ (minus EXCLUDED)."""
    files = [ROOT / "README.md", ROOT / "PRIVACY.md"]
    for top in ("src", "tests", "benchmarks", "docs"):
        files += [p for p in sorted((ROOT / top).rglob("*")) if p.is_file()]
    return [p for p in files if not _skipped(p) and not _excluded(p)]


def text_files() -> list[Path]:
    """The scanned files that are source or documentation (citations live there)."""
    return [p for p in scanned_files() if p.suffix in {".py", ".md", ".txt", ".toml", ".js", ".html"}]


def headings() -> dict[str, int]:
    """Section numbers of docs/ALGORITHM.md ("4", "3.2", ...) → heading level (2 or 3)."""
    text = ALGORITHM.read_text(encoding="utf-8")
    return {m.group(2): len(m.group(1)) for m in HEADING.finditer(text)}


def citations() -> list[tuple[str, str]]:
    """(file, section) for every "ALGORITHM.md §N" in the scanned text files."""
    out = []
    for path in text_files():
        text = path.read_text(encoding="utf-8")
        for m in CITATION.finditer(text):
            out += [(path.relative_to(ROOT).as_posix(), s) for s in SECTION.findall(m.group(1))]
    return out


# ----- (a) ALGORITHM.md and the citations of it ------------------------------------------------


def test_algorithm_md_has_sections_1_to_16_in_order() -> None:
    text = ALGORITHM.read_text(encoding="utf-8")
    top = [m.group(1) for m in re.finditer(r"^## (\d+)\. ", text, re.MULTILINE)]
    assert top == [str(i) for i in range(1, 17)], top


def test_subsections_belong_to_their_section() -> None:
    found = headings()
    for number, level in found.items():
        if level == 3:
            assert "." in number and number.split(".")[0] in found, number


def test_every_cited_section_exists() -> None:
    found = headings()
    cited = citations()
    # the code cites the document ~170 times: a scan that finds few citations is broken
    assert len(cited) >= 100, f"only {len(cited)} citations found; the scan is broken"
    assert {s for _, s in cited} >= {str(i) for i in range(1, 13)}
    missing = sorted({(f, s) for f, s in cited if s not in found})
    assert not missing, f"cited sections missing from docs/ALGORITHM.md: {missing}"


@pytest.mark.parametrize(("text", "expected"), [
    ("see ALGORITHM.md §4.", ["4"]),
    ("(ALGORITHM.md §3, §4)", ["3", "4"]),
    ("ALGORITHM.md §3–§4 and ALGORITHM.md §4/§5", ["3", "4", "4", "5"]),
    ("the distribution of ALGORITHM.md\n§9; with m = 1", ["9"]),
    ("ALGORITHM.md §3.2 (discrete noise)", ["3.2"]),
    ("ALGORITHM.md's formula", []),
])
def test_citation_pattern(text: str, expected: list[str]) -> None:
    got = [s for m in CITATION.finditer(text) for s in SECTION.findall(m.group(1))]
    assert got == expected


def test_a_missing_section_would_be_caught() -> None:
    found = headings()
    assert "17" not in found and "3.9" not in found
    assert "3.2" in found and "4" in found


# ----- (b) nothing points outside the repository ------------------------------------------------


def test_nothing_points_outside_the_repository() -> None:
    files = scanned_files()
    names = {p.relative_to(ROOT).as_posix() for p in files}
    assert {"README.md", "PRIVACY.md", "docs/ALGORITHM.md", "tests/test_docs.py"} <= names
    assert not any(n.startswith("docs/results/") for n in names)
    hits = []
    for path in files:
        text = path.read_bytes().decode("utf-8", errors="replace")
        for what, pattern in FORBIDDEN.items():
            for m in pattern.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                hits.append(f"{path.relative_to(ROOT)}:{line}: {what} ({m.group(0)!r})")
    assert not hits, "files point outside the repository:\n" + "\n".join(hits)


@pytest.mark.parametrize("text", [
    "The algorithms follow `" + "SP" + "EC.md`.",
    "NDCG (generalized, " + "SP" + "EC §9)",
    "data in `../" + "shared/data`",
    "/work/" + "shared/papers",
])
def test_forbidden_patterns_match(text: str) -> None:
    assert any(p.search(text) for p in FORBIDDEN.values())


def test_allowed_text_does_not_match() -> None:
    for text in ("docs/ALGORITHM.md §4", "a spec of the run", "shared machine", "the specification"):
        assert not any(p.search(text) for p in FORBIDDEN.values()), text
