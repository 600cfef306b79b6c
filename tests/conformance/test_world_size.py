"""`hetero conformance NAME --world-size N`: collectives and expert parallelism on spawned ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetero import Registry
from hetero.cli import main
from hetero_conformance import report

ROOT = Path(__file__).resolve().parents[2]

BAD_COMM_PLUGIN = """
import os
import hetero
from hetero.distributed import TorchCommunicator
from hetero_cpu_ref.plugin import CpuRefBackend


class Unreduced(TorchCommunicator):
    def all_reduce(self, x, op="sum"):
        return x.clone()


class DiesInBroadcast(TorchCommunicator):
    def broadcast(self, x, src):
        if self.rank == 1:
            os._exit(7)
        return super().broadcast(x, src)


class HangsInBroadcast(TorchCommunicator):
    def broadcast(self, x, src):
        if self.rank == 1:
            import time
            time.sleep(3600)
        return super().broadcast(x, src)


class Bad(CpuRefBackend):
    name = "{name}"
    priority = -2000

    def communicator(self, group=None):
        return {comm}(group)


@hetero.hookimpl
def hetero_backends():
    return [Bad]
"""


def _validate(doc: dict) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator(report.schema()).validate(doc)


@pytest.mark.parametrize("world", [2, 4])
def test_cpu_ref_passes_every_distributed_case(world, tmp_path):
    path = tmp_path / "r.json"
    assert (
        main(["conformance", "cpu_ref", "--world-size", str(world), "--quick", "--timeout", "60", "--json", str(path)])
        == 0
    )
    doc = json.loads(path.read_text())
    _validate(doc)
    assert doc["run"]["world_size"] == world
    cases = doc["cases"]
    assert cases and all(c["status"] == "pass" for c in cases), [c for c in cases if c["status"] != "pass"]
    ops = {c["op"] for c in cases}
    assert {
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "broadcast",
        "barrier",
        "ep_dispatch+ep_combine",
    } <= ops
    shapes = {c["shape"] for c in cases if c["op"] == "ep_dispatch+ep_combine"}
    assert any("qwen3-30b-a3b" in s for s in shapes) and any("deepseek-v3" in s for s in shapes)
    assert all(s.startswith(f"world{world}.") for s in shapes)


def test_an_interpreted_triton_backend_runs_its_ranks_over_gloo(monkeypatch, tmp_path):
    """cuda under the interpreter takes CPU tensors: its ranks need process_group_backend() (gloo), not nccl."""
    monkeypatch.setenv("HETERO_TRITON_INTERPRET", "1")
    path = tmp_path / "r.json"
    assert main(["conformance", "cuda", "--world-size", "2", "--quick", "--timeout", "60", "--json", str(path)]) == 0
    cases = json.loads(path.read_text())["cases"]
    assert cases and all(c["status"] == "pass" for c in cases), [c for c in cases if c["status"] != "pass"]


def test_an_unreduced_all_reduce_fails(make_dist, tmp_path):
    make_dist("unreduced", BAD_COMM_PLUGIN.format(name="unreduced", comm="Unreduced"))
    path = tmp_path / "r.json"
    assert (
        main(
            ["conformance", "unreduced", "--world-size", "2", "--quick", "--timeout", "60", "--json", str(path)],
            registry=Registry(),
        )
        == 1
    )
    doc = json.loads(path.read_text())
    _validate(doc)
    failed = {c["op"] for c in doc["cases"] if c["status"] == "fail"}
    assert failed == {"all_reduce"}, doc["cases"]
    assert all(c["status"] == "pass" for c in doc["cases"] if c["op"] != "all_reduce")


def test_a_dying_rank_is_reported_not_hung(make_dist, tmp_path):
    make_dist("dies", BAD_COMM_PLUGIN.format(name="dies", comm="DiesInBroadcast"))
    path = tmp_path / "r.json"
    assert (
        main(
            ["conformance", "dies", "--world-size", "2", "--quick", "--timeout", "20", "--json", str(path)],
            registry=Registry(),
        )
        == 1
    )
    doc = json.loads(path.read_text())
    _validate(doc)
    by_op: dict[str, set] = {}
    for c in doc["cases"]:
        by_op.setdefault(c["op"], set()).add(c["status"])
    assert by_op["all_reduce"] == {"pass"}
    first = next(c for c in doc["cases"] if c["op"] == "broadcast")
    assert first["status"] == "crashed" and "rank 1 died (exit code 7) in this case" in first["message"], first
    assert by_op["ep_dispatch+ep_combine"] == {"crashed"}


def test_world_size_one_is_the_single_process_run(tmp_path):
    path = tmp_path / "r.json"
    assert main(["conformance", "cpu_ref", "--ops", "silu_and_mul", "--quick", "--json", str(path)]) == 0
    doc = json.loads(path.read_text())
    assert doc["run"]["world_size"] == 1 and doc["run"]["timeout_s"] is None


def test_torchrun_entry_point():
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("no torchrun next to this interpreter")
    proc = subprocess.run(
        [
            str(torchrun),
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "hetero_conformance.distributed",
            "cpu_ref",
            "--quick",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "HETERO_COMM_TIMEOUT": "30"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pass     ep_dispatch+ep_combine/world2.deepseek-v3.t4/float32" in proc.stdout


EP_DROPS_WEIGHTS_PLUGIN = '''
import dataclasses

import torch

import hetero
from hetero_cpu_ref.plugin import CpuRefBackend


class DropsWeights(CpuRefBackend):
    """ep_combine sums the expert outputs without the routing weights (as DeepEP's normal combine does)."""

    name = "{name}"
    priority = -2000

    @staticmethod
    def ep_combine(y_local, dispatch):
        unweighted = dataclasses.replace(dispatch, weights=torch.ones_like(dispatch.weights))
        return CpuRefBackend.ep_combine(y_local, unweighted)


@hetero.hookimpl
def hetero_backends():
    return [DropsWeights]
'''


def test_a_combine_without_routing_weights_fails_on_ep_only(make_dist, tmp_path):
    make_dist("unweighted", EP_DROPS_WEIGHTS_PLUGIN.format(name="unweighted"))
    path = tmp_path / "r.json"
    assert (
        main(
            ["conformance", "unweighted", "--world-size", "2", "--quick", "--timeout", "60", "--json", str(path)],
            registry=Registry(),
        )
        == 1
    )
    doc = json.loads(path.read_text())
    failed = {c["op"] for c in doc["cases"] if c["status"] == "fail"}
    assert failed == {"ep_dispatch+ep_combine"}, doc["cases"]
    assert all(c["status"] == "pass" for c in doc["cases"] if c["op"] != "ep_dispatch+ep_combine")


def test_a_hanging_rank_is_reported_as_timeout(make_dist, tmp_path):
    import time

    make_dist("hangs", BAD_COMM_PLUGIN.format(name="hangs", comm="HangsInBroadcast"))
    path = tmp_path / "r.json"
    start = time.monotonic()
    assert (
        main(
            ["conformance", "hangs", "--world-size", "2", "--quick", "--timeout", "8", "--json", str(path)],
            registry=Registry(),
        )
        == 1
    )
    elapsed = time.monotonic() - start
    doc = json.loads(path.read_text())
    first = next(c for c in doc["cases"] if c["op"] == "broadcast")
    # rank 0's broadcast times out (CommError ends it) while rank 1 sleeps; which the parent sees
    # first, a rank that ended or a stall, decides between crashed and timeout: both say "not pass"
    assert first["status"] in ("timeout", "crashed", "error"), first
    assert all(c["status"] != "pass" for c in doc["cases"] if c["op"] in ("broadcast", "barrier")), doc["cases"]
    assert elapsed < 8 * 2 + 60, elapsed  # the collective timeout, then the stall watch; never an hour
