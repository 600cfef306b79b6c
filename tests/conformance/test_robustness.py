"""`hetero conformance NAME --robustness`: the malformed-call catalog, its statuses, reports and planted bugs."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest
import torch.distributed as dist
from broken_robustness import PLANTED, plugin_source

import hetero
from hetero import Registry
from hetero.cli import main
from hetero.spec import OP_NAMES
from hetero.verify.calls import call as bind
from hetero_conformance import report
from hetero_conformance.cases.malformed import catalog
from hetero_conformance.robustness import attempt, one_rank_comm

CALLS = catalog()


def _validate(doc: dict) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator(report.schema()).validate(doc)


def _run(tmp_path: Path, name: str, *extra: str, registry: Registry | None = None) -> tuple[int, dict[str, dict], dict]:
    path = tmp_path / f"{name}.json"
    rc = main(["conformance", name, "--robustness", "--json", str(path), *extra], registry=registry or Registry())
    doc = json.loads(path.read_text())
    _validate(doc)
    return rc, {c["id"]: c for c in doc["robustness"]["calls"]}, doc


def test_catalog_spans_every_op_with_index_defects_well_represented():
    per_op = Counter(c.op for c in CALLS)
    assert set(per_op) == set(OP_NAMES) and len(CALLS) >= 40
    assert all(c.id == f"{c.op}/{c.defect}" and c.arg for c in CALLS)
    index_ops = {c.op for c in CALLS if c.index}
    assert sum(c.index for c in CALLS) >= 25
    assert {
        "paged_attention",
        "mla_attention",
        "varlen_attention",
        "write_kv",
        "write_mla_kv",
        "grouped_gemm",
        "moe_permute",
        "moe_unpermute",
        "fused_moe",
        "rotary_embedding",
    } <= index_ops


@pytest.fixture(scope="module")
def reference():
    yield hetero.load("cpu_ref", validate=True)
    if dist.is_initialized():  # the ep calls' one-rank group: later tests expect none in this process
        dist.destroy_process_group()


@pytest.mark.parametrize("call", CALLS, ids=[c.id for c in CALLS])
def test_the_reference_runs_the_valid_call_and_rejects_the_defect_by_argument(reference, call):
    """The valid half runs; the malformed call raises OpError naming exactly the broken argument."""
    draw = call.draw(0, reference.device, reference, lambda: one_rank_comm(reference))
    bind(getattr(reference, call.op), call.op, call.valid(draw))
    draw = call.draw(0, reference.device, reference, lambda: one_rank_comm(reference))
    with pytest.raises(hetero.OpError) as info:
        bind(getattr(reference, call.op), call.op, call.inputs(draw))
    assert info.value.op == call.op and info.value.arg == call.arg, str(info.value)
    assert attempt(reference, call).status == "rejected"


def test_cpu_ref_passes_and_every_report_has_the_tier(tmp_path, capsys):
    junit, md = tmp_path / "r.xml", tmp_path / "r.md"
    rc, calls, doc = _run(tmp_path, "cpu_ref", "--junit", str(junit), "--markdown", str(md))
    assert rc == 0, [c for c in calls.values() if not c["ok"]]
    assert len(calls) == len(CALLS) and {c["status"] for c in calls.values()} == {"rejected"}
    assert doc["schema_version"] == "1.1" and doc["run"]["tier"] == "robustness" and doc["summary"]["ok"]
    rob = doc["robustness"]
    assert rob["validate"] and rob["summary"]["rejected"] == len(CALLS) and 0 < rob["per_call_s"] < 5
    suites = {s.get("name"): s for s in ET.parse(junit).getroot().iter("testsuite")}
    tier = suites["hetero_conformance.cpu_ref.robustness"]
    assert tier.get("tests") == str(len(CALLS)) and tier.get("failures") == "0"
    text = md.read_text()
    assert (
        "#### Robustness" in text
        and f"| paged_attention | {sum(c.op == 'paged_attention' for c in CALLS)} |" in text
        and "PASSED" in capsys.readouterr().out
    )


@pytest.mark.parametrize("bug", ["skips_slot_check", "faults_past_group_end"])
def test_a_planted_bounds_bug_is_caught_on_its_op_alone(make_dist, tmp_path, capsys, bug):
    op, status, _ = PLANTED[bug]
    make_dist(bug, plugin_source(bug))
    rc, calls, _ = _run(tmp_path, bug)
    assert rc == 1
    failing = {cid: c for cid, c in calls.items() if not c["ok"]}
    assert failing and {c["op"] for c in failing.values()} == {op}
    assert all(c["status"] == status and c["index"] for c in failing.values())
    assert all(c["status"] == "rejected" for c in calls.values() if c["op"] != op)
    assert op in capsys.readouterr().out
    if status == "crashed":
        assert all("SIGSEGV" in c["message"] for c in failing.values())


def test_without_validation_silent_passes_for_index_defects_but_a_crash_still_fails(make_dist, tmp_path):
    make_dist("skips_slot_check", plugin_source("skips_slot_check"))
    make_dist("faults_past_group_end", plugin_source("faults_past_group_end"))
    rc, calls, doc = _run(tmp_path, "skips_slot_check", "--no-validate", "--ops", "write_kv")
    assert rc == 0 and not doc["robustness"]["validate"]
    assert {c["status"] for c in calls.values() if c["index"]} == {"silent"}
    assert {c["status"] for c in calls.values() if not c["index"]} == {"rejected"}
    rc, calls, _ = _run(tmp_path, "faults_past_group_end", "--no-validate", "--ops", "grouped_gemm")
    assert rc == 1 and calls["grouped_gemm/group_ends_past_M"]["status"] == "crashed"


def test_an_error_of_the_wrong_type_is_unclear(make_dist, tmp_path):
    make_dist("unchecked_expert_index", plugin_source("unchecked_expert_index"))
    rc, calls, _ = _run(tmp_path, "unchecked_expert_index", "--ops", "moe_permute", "route")
    assert rc == 1
    unclear = {cid for cid, c in calls.items() if c["status"] == "unclear"}
    assert unclear == {"moe_permute/expert_id_negative", "moe_permute/expert_id_past_E"}
    assert all("expected hetero.OpError" in calls[cid]["message"] and not calls[cid]["ok"] for cid in unclear)
    assert {c["status"] for cid, c in calls.items() if cid not in unclear} == {"rejected"}


def test_a_hang_is_a_timeout_and_the_run_goes_on(make_dist, tmp_path):
    make_dist("hangs_on_negative_eps", plugin_source("hangs_on_negative_eps"))
    rc, calls, _ = _run(tmp_path, "hangs_on_negative_eps", "--ops", "rms_norm,silu_and_mul", "--timeout", "3")
    assert rc == 1
    hung = calls.pop("rms_norm/eps_negative")
    assert hung["status"] == "timeout" and "--timeout 3" in hung["message"] and not hung["ok"]
    assert {c["status"] for c in calls.values()} == {"rejected"}


@pytest.mark.parametrize("argv", [["--dtypes", "float32"], ["--quick"], ["--world-size", "2"], ["--ops", "nope"]])
def test_usage_errors_exit_2(argv):
    assert main(["conformance", "cpu_ref", "--robustness", *argv]) == 2


def test_no_validate_needs_the_tier():
    assert main(["conformance", "cpu_ref", "--no-validate", "--ops", "gemm"]) == 2


def test_list_options_take_commas_spaces_and_repeats(capsys):
    assert (
        main(
            [
                "conformance",
                "cpu_ref",
                "--robustness",
                "--list",
                "--ops",
                "gemm",
                "rms_norm",
                "--ops",
                "route,silu_and_mul",
            ]
        )
        == 0
    )
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if "/" in line]
    assert {i.split("/")[0] for i in listed} == {"gemm", "rms_norm", "route", "silu_and_mul"}
    assert len(listed) == sum(c.op in ("gemm", "rms_norm", "route", "silu_and_mul") for c in CALLS)


def test_the_pytest_plugin_runs_the_tier(tmp_path):
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
        "--hetero-robustness",
        "--hetero-ops",
        "grouped_gemm,rotary_embedding",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = sum(c.op in ("grouped_gemm", "rotary_embedding") for c in CALLS)
    assert f"{expected} passed" in proc.stdout
