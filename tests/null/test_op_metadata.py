"""Op metadata in the spec (issue 13): every op states its outputs, what it mutates and whether it is
a collective; the metadata types are pytrees; conformance judges outputs from the spec alone."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch
import torch.utils._pytree as pytree

import hetero.verify.outputs as outputs_mod
import hetero_conformance.runner as runner_mod
from hetero.spec import OPS, AttentionMeta, EPDispatch
from hetero.spec._op import COMPARISONS, Output, spec_op
from hetero.verify.case import Case
from hetero_conformance.runner import Expected, Runner

#: the comparison core is hetero.verify's; the runner stays in hetero_conformance
VERIFY = Path(outputs_mod.__file__).parent
SOURCES = {
    "runner": Path(runner_mod.__file__),
    **{m: VERIFY / f"{m}.py" for m in ("oracles", "outputs", "case", "metrics")},
}


@pytest.mark.parametrize("op", list(OPS))
def test_every_op_declares_its_outputs_next_to_its_signature(op):
    spec = OPS[op]
    params = spec.signature.parameters
    assert spec.outputs, f"{op} declares no output"
    for o in spec.outputs:
        assert isinstance(o, Output) and o.name and o.compare in COMPARISONS
        assert o.when is None or o.when in params
    assert all(m.name in params for m in spec.mutates), spec.mutates
    assert len({o.name for o in spec.outputs}) == len(spec.outputs)


def test_declared_metadata_of_some_ops():
    assert OPS["write_kv"].returns == () and OPS["write_kv"].mutated_names == ("k_cache", "v_cache")
    assert OPS["paged_attention"].mutated_names == ("out",)
    assert [o.name for o in OPS["paged_attention"].outputs] == ["out", "lse"]
    assert OPS["paged_attention"].output("lse").when == "return_lse"
    assert OPS["route"].output("ids").compare == "row_set" and OPS["route"].output("ids").reorders == ("weights",)
    assert {op for op, s in OPS.items() if s.collective} == {"ep_dispatch", "ep_combine"}


def test_spec_op_rejects_metadata_that_contradicts_the_signature():
    def op(x: torch.Tensor) -> None:
        """An op."""

    with pytest.raises(ValueError, match="not a parameter"):
        spec_op(returns=(), mutates=("y",))(op)
    with pytest.raises(ValueError, match="unknown parameter"):
        spec_op(returns=(Output("lse", when="return_lse"),))(op)
    with pytest.raises(ValueError, match="compare"):
        Output("out", "roughly")  # type: ignore[arg-type]


def test_attention_meta_is_a_pytree():
    meta = AttentionMeta.build([2, 1], [3, 4], [[0, 1], [2, 3]])
    leaves, treespec = pytree.tree_flatten(meta)
    assert all(isinstance(t, torch.Tensor) for t in leaves) and len(leaves) == 3
    back = pytree.tree_unflatten(leaves, treespec)
    assert isinstance(back, AttentionMeta) and (back.max_query_len, back.max_seq_len) == (2, 4)
    assert torch.equal(back.block_table, meta.block_table)
    wide = pytree.tree_map_only(torch.Tensor, lambda t: t.to(torch.float64), {"meta": meta, "w": (1, 2)})
    assert wide["meta"].seq_lens.dtype == torch.float64 and wide["w"] == (1, 2)


def test_ep_dispatch_is_a_pytree():
    comm = object()
    d = EPDispatch(
        x=torch.ones(3, 2),
        group_ends=torch.tensor([1, 3], dtype=torch.int32),
        weights=torch.ones(3),
        token_index=torch.arange(3),
        recv_splits=(2, 1),
        send_splits=(1, 1),
        send_index=torch.arange(2),
        num_tokens=2,
        num_experts=4,
        comm=comm,
    )  # type: ignore[arg-type]
    leaves, treespec = pytree.tree_flatten(d)
    assert len(leaves) == 5 and all(isinstance(t, torch.Tensor) for t in leaves)
    back = pytree.tree_unflatten([t * 2 for t in leaves], treespec)
    assert isinstance(back, EPDispatch) and back.comm is comm and back.recv_splits == (2, 1)
    assert torch.equal(back.x, d.x * 2) and back.num_experts == 4


def _patched(monkeypatch, op: str, **changes) -> None:
    """Give ``op`` other metadata, as conformance sees it."""
    table = dict(OPS)
    table[op] = dataclasses.replace(OPS[op], **changes)
    monkeypatch.setattr(outputs_mod, "OPS", table)


def _verdict(op: str, name: str, got: torch.Tensor, want: torch.Tensor):
    case = Case(op, "meta", "float32", build=lambda gen, dt: {})
    exp = Expected({}, {name: want}, {name: want.clone()}, {name: (tuple(want.shape), want.dtype)})
    return Runner(None, None)._verdict(case, {name: got}, exp, [])  # type: ignore[arg-type]


def test_the_comparison_is_the_specs(monkeypatch):
    want = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    got = want + 1e-9  # inside gemm's float32 tolerance, not equal
    assert _verdict("gemm", "out", got, want).status == "pass"
    _patched(monkeypatch, "gemm", returns=(Output("out", "exact"),))
    res = _verdict("gemm", "out", got.round(), want.round() + torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64))
    assert res.status == "fail" and "(exact)" in res.message and res.outputs["out"]["kind"] == "exact"


def test_row_sets_follow_the_spec(monkeypatch):
    outs = {"weights": torch.tensor([[0.7, 0.3]]), "ids": torch.tensor([[5, 2]], dtype=torch.int32)}
    aligned = outputs_mod.comparable("route", outs)
    assert aligned["ids"].tolist() == [[2, 5]] and aligned["weights"][0].tolist() == pytest.approx([0.3, 0.7])
    _patched(monkeypatch, "route", returns=(Output("weights"), Output("ids", "exact")))
    assert outputs_mod.comparable("route", outs)["ids"].tolist() == [[5, 2]]


def test_outputs_come_from_returns_and_mutates(monkeypatch):
    k, v = torch.zeros(2), torch.ones(2)
    assert set(outputs_mod.outputs_of("write_kv", {"k_cache": k, "v_cache": v}, None)) == {"k_cache", "v_cache"}
    # an op that both returns a result and writes a state in place
    _patched(monkeypatch, "write_kv", returns=(Output("out"),), mutates=(Output("v_cache"),))
    out = torch.full((2,), 3.0)
    got = outputs_mod.outputs_of("write_kv", {"k_cache": k, "v_cache": v}, out)
    assert got.keys() == {"out", "v_cache"} and got["out"] is out and got["v_cache"] is v
    assert set(outputs_mod.untouched_inputs("write_kv", {"k_cache": k, "v_cache": v})) == {"k_cache"}


def test_optional_outputs_follow_their_argument():
    out, res = torch.zeros(2, 4), torch.ones(2, 4)
    assert set(outputs_mod.outputs_of("rms_norm", {"x": out}, out)) == {"out"}
    assert set(outputs_mod.outputs_of("rms_norm", {"x": out, "residual": res}, (out, res))) == {"out", "residual"}
    with pytest.raises(outputs_mod.OutputMismatch):
        outputs_mod.outputs_of("rms_norm", {"x": out}, (out, res))


@pytest.mark.parametrize("module", ["runner", "oracles", "outputs", "case", "metrics"])
def test_no_private_per_op_table_in_conformance(module):
    source = SOURCES[module].read_text()
    keyed = [op for op in OPS if re.search(rf"""(^|[{{(,])\s*["']{op}["']\s*[:,)]""", source, re.M)]
    assert not keyed, f"{module}.py keys a table by op: {keyed}"
