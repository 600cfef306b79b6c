"""`hetero conformance`: selection, exit codes, reports and their schema, --isolate, the pytest plugin."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import hetero
from hetero import Registry
from hetero.cli import main
from hetero_conformance import report
from hetero_conformance.runner import CaseResult
from hetero_conformance.suite import SuiteResult
from hetero_cpu_ref.plugin import CpuRefBackend

FAST = ["--ops", "rms_norm,silu_and_mul", "--quick"]
ROOT = Path(__file__).resolve().parents[2]

# A catalog for the isolation tests: two gemm cases (family gemm), then silu_and_mul (family layers).
TEST_CATALOG = """
import torch
from hetero.verify.case import Case
from hetero_conformance.cases import layers


def _gemm(gen, dtype):
    return {"a": torch.randn(4, 8, generator=gen).to(dtype), "b": torch.randn(6, 8, generator=gen).to(dtype)}


def catalog(quick=False):
    gemm = [Case("gemm", f"tiny{i}", "float32", _gemm, {"dtype": "float32"}, True) for i in range(2)]
    return gemm + [c for c in layers.cases() if c.op == "silu_and_mul" and c.quick]
"""

BAD_GEMM_PLUGIN = """
import os, time
import hetero
from hetero_cpu_ref.plugin import CpuRefBackend


class Bad(CpuRefBackend):
    name = "{name}"
    priority = -2000

    def gemm(self, a, b, *, bias=None, out_dtype=None):
        {body}


@hetero.hookimpl
def hetero_backends():
    return [Bad]
"""


def _registry_with(*classes: type) -> Registry:
    class Plugin:
        @hetero.hookimpl
        def hetero_backends(self):
            return list(classes)

    registry = Registry()
    registry.register(Plugin(), "test-plugin")
    return registry


class WrongScale(CpuRefBackend):
    """rms_norm 2% too large: the suite must fail it, and only it."""

    name = "wrong_scale"
    priority = -2000

    def rms_norm(self, x, weight, eps, *, residual=None, weight_offset=0.0, gate=None, gate_act="silu"):
        out = CpuRefBackend.rms_norm(
            x, weight, eps, residual=residual, weight_offset=weight_offset, gate=gate, gate_act=gate_act
        )
        return (out[0] * 1.02, out[1]) if isinstance(out, tuple) else out * 1.02


class OnlySiluFp32(hetero.Backend):
    """silu_and_mul only, declining bfloat16: skipped and fallback cases, nothing failing."""

    name = "only_silu"
    spec_version = hetero.SPEC_VERSION
    silu_and_mul = staticmethod(CpuRefBackend.silu_and_mul)

    def supports(self, op, **static):
        return "no bfloat16 on this chip" if static.get("dtype") == "bfloat16" else None


def _validate(doc: dict) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(report.schema())
    jsonschema.Draft202012Validator(report.schema()).validate(doc)


def test_cpu_ref_passes_and_writes_every_report(tmp_path, capsys):
    paths = {ext: tmp_path / f"r.{ext}" for ext in ("json", "xml", "md")}
    argv = [
        "conformance",
        "cpu_ref",
        *FAST,
        "--json",
        str(paths["json"]),
        "--junit",
        str(paths["xml"]),
        "--markdown",
        str(paths["md"]),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "PASSED" in out and "rms_norm" in out
    doc = json.loads(paths["json"].read_text())
    assert (
        doc["schema_version"] == "1.0"
        and doc["backend"]["name"] == "cpu_ref"
        and doc["backend"]["package"] == "hetero-cpu-ref"
    )
    assert doc["summary"]["ok"] and doc["summary"]["total"] == doc["summary"]["pass"] == len(doc["cases"]) > 0
    assert {c["op"] for c in doc["cases"]} == {"rms_norm", "silu_and_mul"}
    assert doc["run"]["command"].startswith("hetero conformance cpu_ref --quick --ops rms_norm,silu_and_mul")
    junit = ET.parse(paths["xml"]).getroot()
    assert junit.tag == "testsuites" and int(junit.get("tests")) == len(doc["cases"]) and junit.get("failures") == "0"
    assert {tc.get("classname") for tc in junit.iter("testcase")} == {"cpu_ref.rms_norm", "cpu_ref.silu_and_mul"}
    md = paths["md"].read_text()
    assert (
        md.startswith("### hetero conformance: `cpu_ref` :white_check_mark: passed") and "| rms_norm | float32 |" in md
    )
    _validate(doc)


def test_a_wrong_backend_fails_on_the_right_op_and_exits_1(tmp_path, capsys):
    path = tmp_path / "r.json"
    assert main(["conformance", "wrong_scale", *FAST, "--json", str(path)], registry=_registry_with(WrongScale)) == 1
    assert "FAILED" in capsys.readouterr().out
    doc = json.loads(path.read_text())
    status = {c["id"]: c["status"] for c in doc["cases"]}
    assert {s for i, s in status.items() if i.startswith("rms_norm/")} == {"fail"}
    assert {s for i, s in status.items() if i.startswith("silu_and_mul/")} == {"pass"}
    assert not doc["summary"]["ok"] and doc["summary"]["fail"] == sum(i.startswith("rms_norm/") for i in status)
    _validate(doc)


def test_skipped_and_fallback_do_not_fail_the_run(tmp_path):
    path = tmp_path / "r.json"
    assert main(["conformance", "only_silu", *FAST, "--json", str(path)], registry=_registry_with(OnlySiluFp32)) == 0
    status = {c["id"]: (c["status"], c["message"]) for c in json.loads(path.read_text())["cases"]}
    assert status["silu_and_mul/qwen3-8b.t7/float32"][0] == "pass"
    assert status["silu_and_mul/qwen3-8b.t7/bfloat16"] == ("skipped", "supports() declined: no bfloat16 on this chip")
    assert {s for i, (s, _) in status.items() if i.startswith("rms_norm/")} == {"fallback"}


def test_list_and_selectors(capsys):
    assert main(["conformance", "cpu_ref", "--list", "-k", "rms_norm/*/bfloat16"]) == 0
    ids = [line.split()[0] for line in capsys.readouterr().out.splitlines() if "/" in line]
    assert ids and all(re.fullmatch(r"rms_norm/[^/]+/bfloat16", i) for i in ids)
    assert (
        main(["conformance", "cpu_ref", "--list", "--quick", "--dtypes", "float32", "-k", "residual", "-k", "silu"])
        == 0
    )
    ids = [line.split()[0] for line in capsys.readouterr().out.splitlines() if "/" in line]
    assert ids and all(i.endswith("/float32") and ("residual" in i or "silu" in i) for i in ids)


@pytest.mark.parametrize(
    "argv", [["--ops", "no_such_op"], ["--dtypes", "float64"], ["--ops", "rms_norm", "-k", "nothing-matches-this"]]
)
def test_usage_errors_exit_2(argv, capsys):
    assert main(["conformance", "cpu_ref", *argv]) == 2
    assert "hetero conformance" in capsys.readouterr().err


def test_without_the_package_the_subcommand_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "hetero_conformance.cli", None)
    assert main(["conformance", "cpu_ref", "--quick"]) == 2
    assert "install hetero-conformance" in capsys.readouterr().err


def test_non_finite_metrics_are_written_as_strings(tmp_path):
    result = CaseResult(
        "gemm/x/float32",
        "gemm",
        "gemm",
        "x",
        "float32",
        "fail",
        "inf error",
        outputs={
            "out": {
                "kind": "float",
                "rel_l2": float("inf"),
                "max_abs": float("nan"),
                "max_rel": 1.0,
                "cosine": 0.0,
                "nonfinite_mismatch": 3,
                "scale": 0.0,
                "numel": 4,
                "ref_max_abs": 0.0,
                "ref_rel_l2": 0.0,
                "bound_max_abs": 0.0,
                "bound_rel_l2": 1e-5,
            }
        },
    )
    suite = SuiteResult(json.loads(json.dumps(_meta())), [result])
    report.write_json(suite, tmp_path / "r.json")
    doc = json.loads((tmp_path / "r.json").read_text())
    assert (
        doc["cases"][0]["outputs"]["out"]["rel_l2"] == "inf" and doc["cases"][0]["outputs"]["out"]["max_abs"] == "nan"
    )
    assert "over" in report.to_markdown(suite)
    _validate(doc)


def _meta() -> dict:
    return {
        "spec_version": "1.0.0",
        "tool": {"hetero": "0.1.0", "hetero_conformance": "0.1.0"},
        "backend": {
            "name": "x",
            "package": "",
            "version": "in-process",
            "spec_version": "1.0.0",
            "device": "cpu",
            "device_name": "",
            "details": {},
        },
        "environment": {
            "python": "3",
            "platform": "p",
            "torch": "2",
            "triton": None,
            "cuda": None,
            "hip": None,
            "driver": None,
        },
        "run": {
            "seed": 0,
            "tier": "full",
            "selection": {"ops": [], "dtypes": [], "patterns": [], "catalog": "c:f"},
            "isolate": False,
            "timeout_s": None,
            "command": "hetero conformance x",
            "started_at": "2025-01-01T00:00:00+00:00",
            "duration_s": 0.0,
        },
    }


def test_the_documentation_names_every_schema_field():
    doc = (ROOT / "docs" / "conformance-report.md").read_text()

    def names(node: dict):
        for key, sub in node.get("properties", {}).items():
            yield key
            yield from names(sub)
        for sub in node.get("$defs", {}).values():
            yield from names(sub)
        for sub in node.get("oneOf", []) + node.get("anyOf", []):
            yield from names(sub)

    missing = sorted({n for n in names(report.schema()) if f"`{n}`" not in doc})
    assert not missing, f"docs/conformance-report.md does not document {missing}"


def _isolated_run(make_dist, tmp_path: Path, name: str, body: str, *extra: str) -> tuple[int, dict[str, dict]]:
    make_dist(name, BAD_GEMM_PLUGIN.format(name=name, body=body))
    (make_dist.site / "hetero_conftest_catalog.py").write_text(TEST_CATALOG)
    make_dist.packages.append("hetero_conftest_catalog")  # unloaded at teardown with the plugin
    path = tmp_path / "r.json"
    argv = [
        "conformance",
        name,
        "--isolate",
        "--catalog",
        "hetero_conftest_catalog:catalog",
        "--json",
        str(path),
        *extra,
    ]
    rc = main(argv, registry=Registry())
    doc = json.loads(path.read_text())
    _validate(doc)
    return rc, {c["id"]: c for c in doc["cases"]}


def test_isolate_reports_a_crash_and_runs_the_other_families(make_dist, tmp_path):
    rc, cases = _isolated_run(make_dist, tmp_path, "aborts", "os.abort()")
    assert rc == 1
    first, second = cases["gemm/tiny0/float32"], cases["gemm/tiny1/float32"]
    assert first["status"] == "crashed" and "SIGABRT" in first["message"]
    assert second["status"] == "crashed" and second["message"].startswith("not run")
    layers = [c for i, c in cases.items() if i.startswith("silu_and_mul/")]
    assert layers and {c["status"] for c in layers} == {"pass"}


def test_isolate_reports_a_hang_as_timeout(make_dist, tmp_path):
    rc, cases = _isolated_run(make_dist, tmp_path, "hangs", "time.sleep(10 ** 6)", "--timeout", "5")
    assert rc == 1
    assert (
        cases["gemm/tiny0/float32"]["status"] == "timeout" and "--timeout 5" in cases["gemm/tiny0/float32"]["message"]
    )
    assert cases["gemm/tiny1/float32"]["status"] == "timeout"
    assert {c["status"] for i, c in cases.items() if i.startswith("silu_and_mul/")} == {"pass"}


def test_pytest_plugin_runs_the_catalog(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--pyargs",
        "hetero_conformance",
        "--hetero-backend",
        "cpu_ref",
        "--hetero-quick",
        "--hetero-ops",
        "rms_norm,silu_and_mul",
        "--junitxml",
        str(tmp_path / "j.xml"),
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"\d+ passed", proc.stdout) and "failed" not in proc.stdout
    names = {tc.get("name") for tc in ET.parse(tmp_path / "j.xml").getroot().iter("testcase")}
    assert "test_case[rms_norm/qwen3-8b.t7/float32]" in names
