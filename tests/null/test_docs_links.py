"""The project's documents point only at what the repository holds.

* No file refers to a DESIGN.md: the project's design document is docs/architecture.md,
  and a design file outside the repository is not something a reader of a clone can open.
* Every repository path that docs/architecture.md names in backticks exists. A path names
  a file or a directory, relative to the repository root, and may hold ``*`` or a
  ``<placeholder>`` for one path component (``backends/*/``, ``hetero/spec/<family>.py``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
#: where a reference to DESIGN.md is looked for: the shipped packages, the docs and the scripts
SCANNED = ("docs", "README.md", "hetero", "backends", "conformance", "integrations", "scripts")
#: directories that hold build or cache output, not the project's text
SKIPPED_DIRS = {"__pycache__", "build", "dist", ".pytest_cache"}
#: the first component of a backticked string that makes it a repository path
PATH_ROOTS = ("hetero/", "backends/", "conformance/", "integrations/", "docs/", "tests/", "benchmarks/", "scripts/")


def _files(entry: Path):
    if entry.is_file():
        yield entry
        return
    for path in sorted(entry.rglob("*")):
        parts = path.relative_to(ROOT).parts
        if path.is_file() and not any(p in SKIPPED_DIRS or p.endswith(".egg-info") for p in parts):
            yield path


def test_nothing_refers_to_a_design_md():
    found = [
        str(path.relative_to(ROOT))
        for name in SCANNED
        for path in _files(ROOT / name)
        if b"DESIGN.md" in path.read_bytes()
    ]
    assert not found, f"these files refer to a DESIGN.md, which is not part of the repository: {found}"


def architecture_paths(text: str) -> list[str]:
    """The backticked strings of ``text`` that are repository paths, in order, without repeats."""
    paths = []
    for span in re.findall(r"`([^`\s]+)`", text):
        if "/" in span and span.startswith(PATH_ROOTS) and span not in paths:
            paths.append(span)
    return paths


def exists(path: str) -> bool:
    """Whether ``path`` (``*`` or ``<name>`` standing for one component) names something in the tree."""
    pattern = re.sub(r"<[^>/]+>", "*", path).rstrip("/")
    if "*" not in pattern:
        return (ROOT / pattern).exists()
    return any(ROOT.glob(pattern))


def test_architecture_names_paths():
    # a guard for the test below: a change to the page's notation must not leave it checking nothing
    paths = architecture_paths(ARCHITECTURE.read_text(encoding="utf-8"))
    assert len(paths) > 20 and "hetero/spec/" in paths and "backends/*/" in paths, paths


@pytest.mark.parametrize("path", architecture_paths(ARCHITECTURE.read_text(encoding="utf-8")))
def test_architecture_path_exists(path):
    assert exists(path), f"docs/architecture.md names `{path}`, which is not in the repository"


def test_path_recognition():
    text = "see `hetero/spec/`, `hetero.spec.checks`, `LLM`, `backends/*/`, `a/b`, `docs/x.md` and `docs/x.md`"
    assert architecture_paths(text) == ["hetero/spec/", "backends/*/", "docs/x.md"]
    assert exists("hetero/spec/<family>.py") and exists("backends/*/") and exists("docs/architecture.md")
    assert not exists("hetero/no_such_module.py") and not exists("backends/*/no_such_file")
