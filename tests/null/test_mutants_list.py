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
    stale = {
        "id": "a",
        "area": "engine",
        "file": "mod.py",
        "original": "x = 1",
        "replacement": "x = 2",
        "description": "",
        "tests": ["tests/nope.py"],
    }
    found = runner.problems([stale, dict(stale, file="gone.py")], tmp_path)
    assert any("occurs 2 times" in p for p in found)
    assert any("no test tests/nope.py" in p for p in found)
    assert any("duplicate id" in p for p in found)
    assert any("gone.py" in p for p in found)


def test_node_ids_of_the_same_file_fold_into_it():
    assert runner.union(["a.py::t", "a.py", "b.py::t", "b.py::t"]) == ["a.py", "b.py::t"]


def _baselines(monkeypatch, failing: set[str]):
    runs: list[list[str]] = []

    def fake_run(self, paths):
        runs.append(paths)
        bad = sorted(set(paths) & failing)
        return f"exit 1: {bad[0]}" if bad else None

    monkeypatch.setattr(runner.Baselines, "_run", fake_run)
    return runner.Baselines(Path("."), 1.0), runs


def test_each_test_path_is_proven_once_and_a_node_by_its_file(monkeypatch):
    b, runs = _baselines(monkeypatch, failing={"c.py"})
    assert b.prove(["a.py"]) is None
    assert b.prove(["a.py::t", "b.py::u"]) is None
    assert b.prove(["b.py::u", "a.py"]) is None
    assert b.prove(["c.py"]) == "exit 1: c.py"
    assert b.prove(["a.py", "c.py::v"]) == "exit 1: c.py", "a node of a failing file fails without a rerun"
    assert runs == [["a.py"], ["b.py::u"], ["c.py"]]


def test_a_green_union_proves_every_path_in_one_run(monkeypatch):
    b, runs = _baselines(monkeypatch, failing=set())
    assert b.prove_all(["a.py::t", "b.py", "a.py"])
    assert b.prove(["a.py::x"]) is None and b.prove(["b.py"]) is None
    assert runs == [["b.py", "a.py"]]


def test_a_failing_union_leaves_each_path_to_be_proven_apart(monkeypatch):
    b, runs = _baselines(monkeypatch, failing={"b.py"})
    assert not b.prove_all(["a.py", "b.py"])
    assert b.prove(["a.py"]) is None and b.prove(["b.py"]) is not None
    assert runs == [["a.py", "b.py"], ["a.py"], ["b.py"]]


def test_the_report_counts_per_package():
    mutants = [
        {"id": "x", "file": "hetero/serve/app.py"},
        {"id": "y", "file": "hetero/serve/metrics.py"},
        {"id": "z", "file": "hetero/_plugins.py"},
    ]
    results = {
        "x": runner.Result("x", "caught", 1.0),
        "y": runner.Result("y", "survived", 1.0),
        "z": runner.Result("z", "caught", 1.0),
    }
    assert runner.package_rows(mutants, results) == [
        "| `hetero` | 1 | 1 | `z` |",
        "| `hetero/serve` | 2 | 1 | `x`, `y` |",
    ]
