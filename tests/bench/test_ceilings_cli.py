"""`hetero ceilings`: measured ceilings written in the --ceilings format, and used by hetero profile."""

from __future__ import annotations

import json

import pytest

from hetero.bench.devices import load_ceilings
from hetero.cli import main


def test_measured_ceilings_feed_the_profile_roofline(tmp_path, capsys):
    from hetero.tools import tiny

    out = tmp_path / "cpu.json"
    assert (
        main(["ceilings", "cpu_ref", "--out", str(out), "--size", "256", "--copy-mib", "8", "--dtypes", "float32"]) == 0
    )
    doc = load_ceilings(out)
    assert set(doc["tflops"]) == {"float32"} and doc["tflops"]["float32"] > 0 and doc["tb_s"] > 0
    assert "(measured)" in json.loads(out.read_text())["name"] and "cpu" in capsys.readouterr().out
    model = tiny.build("qwen3", tmp_path / "m")
    assert (
        main(
            [
                "profile",
                "--model",
                str(model),
                "--backend",
                "cpu_ref",
                "--num-requests",
                "2",
                "--output-len",
                "2:2",
                "--ceilings",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["ceilings"] is not None
    fractions = [phase["roofline_fraction"] for phase in report["ops"]["gemm"].values()]
    assert fractions and all(f is not None and f > 0 for f in fractions)


@pytest.mark.parametrize("argv, option", [(["--dtypes", "float8"], "--dtypes"), (["--size", "0"], "--size")])
def test_bad_options_are_usage_errors(tmp_path, capsys, argv, option):
    assert main(["ceilings", "cpu_ref", "--out", str(tmp_path / "c.json"), *argv]) == 2
    assert f"argument {option}" in capsys.readouterr().err
