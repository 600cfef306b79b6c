"""One list syntax everywhere: ``a,b``, ``a b`` and repeats, in any mix (``hetero.cli_args``)."""

from __future__ import annotations

import argparse
import json
import shlex

import pytest

from hetero.cli import build_parser, main
from hetero.cli_args import add_list_option, split_list

FAST = ["--warmup", "0", "--reps", "1", "--min-time", "0", "--no-reference"]


def _parser(**kwargs) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="t")
    add_list_option(p, "--ops", **kwargs)
    p.add_argument("--flag", action="store_true")
    return p


@pytest.mark.parametrize(
    "argv",
    [
        ["--ops", "a,b,c"],
        ["--ops", "a", "b", "c"],
        ["--ops", "a,b", "--ops", "c"],
        ["--ops", "a", "--ops", "b", "c"],
        ["--ops", "a, b,", "c"],
    ],
)
def test_every_syntax_gives_one_flat_list(argv):
    assert _parser().parse_args(argv).ops == ["a", "b", "c"]


def test_default_and_following_options():
    assert _parser().parse_args([]).ops is None
    assert _parser(default=["x"]).parse_args([]).ops == ["x"]
    assert _parser(default=["x"]).parse_args(["--ops", "a", "--ops", "b"]).ops == ["a", "b"], (
        "given replaces the default"
    )
    args = _parser().parse_args(["--ops", "a,b", "--flag"])
    assert args.ops == ["a", "b"] and args.flag


def test_an_empty_list_is_an_error(capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(["--ops", ","])
    assert "expected at least one value" in capsys.readouterr().err


def test_split_list():
    assert split_list("a,b") == ["a", "b"]
    assert split_list(["a,b", " c ", ""]) == ["a", "b", "c"]


@pytest.mark.parametrize("ops", [["gemm,rms_norm"], ["gemm", "rms_norm"], ["gemm", "--ops", "rms_norm"]])
def test_bench_takes_both_syntaxes(tmp_path, ops):
    pytest.importorskip("hetero_conformance")
    report = tmp_path / "r.json"
    assert main(["bench", "cpu_ref", "--ops", *ops, "--json", str(report), *FAST]) == 0
    assert {row["op"] for row in json.loads(report.read_text())["results"]} == {"gemm", "rms_norm"}


def test_the_saved_command_parses_back_to_the_same_ops(tmp_path):
    """The baseline records the command line that reproduces it; its --ops must still parse."""
    pytest.importorskip("hetero_conformance")
    base = tmp_path / "b.json"
    assert main(["bench", "cpu_ref", "--ops", "gemm,rms_norm", "--save", str(base), "--rounds", "1", *FAST]) == 0
    command = json.loads(base.read_text())["command"]
    assert build_parser().parse_args(shlex.split(command)[1:]).ops == ["gemm", "rms_norm"]
