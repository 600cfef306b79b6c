"""Validation levels: shape checks always, index-content checks when ``validate`` is on."""

from __future__ import annotations

import inspect
import re
import types

import pytest
import torch

import hetero
from hetero import OpError, Registry
from hetero.spec import OP_NAMES, OPS, validate
from hetero.spec.types import AttentionMeta


class Trusting(hetero.Backend):
    """A CPU backend whose grouped_gemm and rotary_embedding read their indices unchecked."""

    name, device_type, priority, spec_version = "trusting", "cpu", 10, hetero.SPEC_VERSION
    calls: list[str] = []

    def grouped_gemm(self, a, b, group_ends, *, out_dtype=None):
        Trusting.calls.append("grouped_gemm")
        return a.new_zeros(a.shape[0], b.shape[1])

    def gemm(self, a, b, *, bias=None, out_dtype=None):
        return a @ b.T


def _registry(env: dict[str, str]) -> Registry:
    reg = Registry(env=env)
    plugin = types.SimpleNamespace(hetero_backends=hetero.hookimpl(lambda: [Trusting]))
    reg.register(plugin, "trusting")
    return reg


def _bad_group_ends() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.randn(6, 8), torch.randn(2, 4, 8), torch.tensor([4, 9], dtype=torch.int32)  # 9 > M = 6


@pytest.mark.parametrize(
    "env, device, want",
    [
        ({}, "cpu", True),
        ({}, "cuda", False),
        ({}, "xpu", False),
        ({"HETERO_VALIDATE": "1"}, "cuda", True),
        ({"HETERO_VALIDATE": "on"}, "cuda", True),
        ({"HETERO_VALIDATE": "0"}, "cpu", False),
        ({"HETERO_VALIDATE": "false"}, "cpu", False),
    ],
)
def test_default_is_on_for_cpu_tensors_off_on_accelerators_and_the_env_wins(env, device, want):
    assert validate.default_validate(torch.device(device), env) is want


def test_a_malformed_env_value_is_named():
    with pytest.raises(ValueError, match=r"HETERO_VALIDATE: expected one of .*got 'sometimes'"):
        validate.default_validate(torch.device("cpu"), {"HETERO_VALIDATE": "sometimes"})


def test_validation_on_rejects_bad_indices_before_the_backend_runs():
    Trusting.calls.clear()
    ops = _registry({}).load("trusting", validate=True)
    assert ops.validate
    with pytest.raises(
        OpError, match=r"grouped_gemm: argument 'group_ends': expected values <= the row count 6, got 9"
    ):
        ops.grouped_gemm(*_bad_group_ends())
    assert Trusting.calls == []
    assert ops.explain()["grouped_gemm"].implementation.endswith("Trusting.grouped_gemm")


def test_validation_off_calls_the_backend_itself():
    Trusting.calls.clear()
    ops = _registry({"HETERO_VALIDATE": "1"}).load("trusting", validate=False)
    assert not ops.validate
    assert ops.grouped_gemm == Trusting.grouped_gemm.__get__(ops.backend)
    ops.grouped_gemm(*_bad_group_ends())
    assert Trusting.calls == ["grouped_gemm"]


def test_the_env_decides_when_load_is_not_told():
    assert _registry({"HETERO_VALIDATE": "0"}).load("trusting").validate is False
    assert _registry({}).load("trusting").validate is True  # a CPU backend


def test_ops_without_index_arguments_stay_the_implementation_itself():
    ops = _registry({}).load("trusting", validate=True)
    assert ops.gemm == Trusting.gemm.__get__(ops.backend)


def test_a_backend_that_validates_itself_is_not_wrapped():
    ops = hetero.load("cpu_ref", validate=True)
    from hetero_cpu_ref import moe

    assert ops.moe_permute is moe.moe_permute


def test_every_validator_takes_its_ops_arguments_as_named_in_the_spec():
    for op, check in validate.VALIDATORS.items():
        assert op in OP_NAMES
        spec_params = [p for p in OPS[op].signature.parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
        mine = [p.name for p in inspect.signature(check).parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
        assert mine == [p.name for p in spec_params], op


def _meta(qsl, seq_lens, table, max_q=None, max_s=None) -> AttentionMeta:
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    q = [qsl[i + 1] - qsl[i] for i in range(len(qsl) - 1)]
    return AttentionMeta(
        query_start_loc=i32(qsl),
        seq_lens=i32(seq_lens),
        block_table=i32(table),
        max_query_len=max(q) if max_q is None else max_q,
        max_seq_len=max(seq_lens) if max_s is None else max_s,
    )


@pytest.mark.parametrize(
    "meta, arg, what",
    [
        (_meta([0, 3, 5], [7, 2], [[0, 9], [2, 3]]), "meta.block_table", "block ids in [0, 4)"),
        (_meta([0, 3, 5], [2, 2], [[0, 1], [2, 3]]), "meta.seq_lens", "seq_lens[0] >= its query length 3"),
        (_meta([0, 3, 5], [9, 2], [[0, 1], [2, 3]]), "meta.block_table", "at least 3 columns"),
        (_meta([0, 3, 2], [7, 2], [[0, 1], [2, 3]]), "meta.query_start_loc", "non-decreasing"),
        (_meta([0, 3, 4], [7, 2], [[0, 1], [2, 3]]), "meta.query_start_loc", "last entry equal to the token count 5"),
        (
            _meta([0, 3, 5], [7, 2], [[0, 1], [2, 3]], max_q=2),
            "meta.max_query_len",
            "an int at least the longest query (3)",
        ),
    ],
)
def test_paged_metadata_defects_are_named(meta, arg, what):
    q, cache = torch.randn(5, 2, 8), torch.randn(4, 4, 1, 8)
    validate.paged_attention(q, cache, cache, _meta([0, 3, 5], [7, 2], [[0, 1], [2, 3]]), scale=0.1)  # well formed
    with pytest.raises(OpError, match=rf"paged_attention: argument '{arg}': expected .*{re.escape(what)}"):
        validate.paged_attention(q, cache, cache, meta, scale=0.1)


def test_dsa_validators_name_bad_slots_and_block_ids():
    """write_index_k reads slot_mapping, indexer_topk the metadata, as write_kv and paged_attention do."""
    k, cache = torch.randn(3, 128), torch.randn(4, 4, 128)
    validate.write_index_k(k, cache, torch.tensor([0, -1, 15]))  # well formed
    with pytest.raises(OpError, match=r"write_index_k: argument 'slot_mapping': expected slots in \[-1, 16\)"):
        validate.write_index_k(k, cache, torch.tensor([0, 16, 1]))
    q, w, good = torch.randn(5, 2, 128), torch.rand(5, 2), _meta([0, 3, 5], [7, 2], [[0, 1], [2, 3]])
    validate.indexer_topk(q, w, cache, good, topk=4)
    with pytest.raises(OpError, match=r"indexer_topk: argument 'meta.block_table': expected block ids in \[0, 4\)"):
        validate.indexer_topk(q, w, cache, _meta([0, 3, 5], [7, 2], [[0, 9], [2, 3]]), topk=4)


def test_scaled_grouped_gemm_validator_names_bad_group_ends():
    """scaled_grouped_gemm reads group_ends as grouped_gemm does (spec 1.4)."""
    a, b = torch.zeros(6, 8, dtype=torch.int8), torch.zeros(2, 4, 8, dtype=torch.int8)
    sa, sb = torch.ones(6, 1), torch.ones(2)
    validate.scaled_grouped_gemm(a, b, sa, sb, torch.tensor([4, 6], dtype=torch.int32))  # well formed
    with pytest.raises(
        OpError, match=r"scaled_grouped_gemm: argument 'group_ends': expected values <= the row count 6, got 9"
    ):
        validate.scaled_grouped_gemm(a, b, sa, sb, torch.tensor([4, 9], dtype=torch.int32))
    with pytest.raises(OpError, match=r"scaled_grouped_gemm: argument 'group_ends': expected non-decreasing"):
        validate.scaled_grouped_gemm(a, b, sa, sb, torch.tensor([4, 3], dtype=torch.int32))
