"""The mutation list of `make mutants` still applies to the tree (no mutant is run here)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _runner():
    spec = importlib.util.spec_from_file_location("hetero_mutants_runner", ROOT / "scripts" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


runner = _runner()
MUTANTS = runner.load()


def test_enough_mutants_with_unique_ids():
    ids = [m["id"] for m in MUTANTS]
    assert len(ids) >= 25
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m["id"])
def test_mutant_applies(mutant):
    """Its original text occurs exactly once in its file, it changes it, and its tests exist."""
    assert runner.problems([mutant], ROOT) == []


def test_problems_names_a_stale_mutant(tmp_path):
    (tmp_path / "mod.py").write_text("x = 1\nx = 1\n")
    stale = {"id": "a", "area": "engine", "file": "mod.py", "original": "x = 1", "replacement": "x = 2",
             "description": "", "tests": ["tests/nope.py"]}
    found = runner.problems([stale, dict(stale, file="gone.py")], tmp_path)
    assert any("occurs 2 times" in p for p in found)
    assert any("no test tests/nope.py" in p for p in found)
    assert any("duplicate id" in p for p in found)
    assert any("gone.py" in p for p in found)


def test_node_ids_of_the_same_file_fold_into_it():
    assert runner.union(["a.py::t", "a.py", "b.py::t", "b.py::t"]) == ["a.py", "b.py::t"]
