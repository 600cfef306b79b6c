"""The per-op replay's own rules, without a model: which calls are sampled, the store's cap, the report's status."""

from __future__ import annotations

import pytest
import torch

import hetero
from hetero.engine.instrument import OpSite
from hetero.tools.replay import CallVerdict, OpRecorder, PerOpReport, TensorStore

OPS = hetero.load("cpu_ref")


def _recorded(calls: int, samples: int) -> list[int]:
    """The call numbers an ``OpRecorder`` keeps of ``calls`` calls at one call site."""
    site = OpSite("model.layers.0.mlp.act", "_act", "silu_and_mul")
    x = torch.randn(2, 8)
    with TensorStore(1 << 20) as store:
        recorder = OpRecorder(store, samples)
        for _ in range(calls):
            torch.testing.assert_close(recorder(site, OPS.silu_and_mul, (x,), {}), OPS.silu_and_mul(x))
        kept = [r.index for r in recorder.records]
        assert store.nbytes == sum(store._sizes.values())
        assert len(list(store.root.iterdir())) == len(kept), "a dropped call's file is deleted"
        skipped = sum(recorder.skipped.values())
    assert skipped == calls - len(kept)
    return kept


@pytest.mark.parametrize(
    "calls, samples, want",
    [
        (1, 4, [0]),
        (2, 4, [0, 1]),
        (3, 4, [0, 1, 2]),  # call 2: the first power of two past the early half
        (5, 4, [0, 1, 2, 4]),
        (9, 4, [0, 1, 4, 8]),  # 8 takes the place of 2, the oldest late one
        (20, 4, [0, 1, 8, 16]),
        (20, 2, [0, 16]),
        (20, 1, [0]),
    ],
)
def test_a_site_keeps_its_first_calls_and_the_latest_powers_of_two(calls, samples, want):
    assert _recorded(calls, samples) == want


def test_the_store_takes_tensors_up_to_its_cap_inclusive(tmp_path):
    t = torch.zeros(4, 4)  # 64 bytes
    with TensorStore(128, root=tmp_path) as store:
        assert store.fits(128) and not store.fits(129)
        assert store.put("a", {"t": t}) and store.put("b", {"t": t}), "two 64-byte files fill a 128-byte cap"
        assert store.nbytes == 128 and not store.fits(1)
        assert not store.put("c", {"t": t[:1, :1]})
        store.delete("a")
        assert store.fits(64) and store.put("c", {"t": t})
        assert torch.equal(store.get("c")["t"], t)


def _verdict(index: int, *, problems=(), error=None) -> CallVerdict:
    return CallVerdict(
        index,
        f"model.layers.{index}.mlp",
        "_gemm",
        "gemm",
        {},
        problems=list(problems),
        error=error,
    )


@pytest.mark.parametrize(
    "calls, unrecorded, drift, status",
    [
        ([0, 1], [], None, "ok"),
        ([0, 1], [], "layer 1", "drift"),
        ([0, "error"], [], None, "inconclusive"),
        ([0, 1], [("model.layers.3.mlp", "gemm")], None, "inconclusive"),
        ([0, "error"], [("model.layers.3.mlp", "gemm")], "layer 1", "inconclusive"),
        ([0, "fault", "error"], [("model.layers.3.mlp", "gemm")], "layer 1", "fault"),
    ],
)
def test_the_status_is_fault_then_inconclusive_then_drift_then_ok(calls, unrecorded, drift, status):
    verdicts = [
        _verdict(
            i, problems=["'out': rel_l2 too large"] if c == "fault" else (), error="boom" if c == "error" else None
        )
        for i, c in enumerate(calls)
    ]
    report = PerOpReport("cpu_ref", "float32", verdicts, unrecorded=unrecorded)
    assert report.status(drift) == status
    assert report.passed == (report.status() == "ok")
    assert report.as_dict(drift)["status"] == status
    if status == "fault":
        assert report.first_fault.index == calls.index("fault")
