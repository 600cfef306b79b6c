"""The Triton kv_compress kernels against the reference, through Triton's interpreter on CPU tensors:
CSA-like (overlap), HCA-like (slots in several tiles) and odd-D compressors over batches mixing fresh
prompts, continuing chunks (a ring partly NaN before token 0), decodes that close a window or not,
padding and empty sequences; the device-side entry plan; T = 0; strided inputs; and memory safety on
malformed metadata with validation off (in a child process, where a stray access cannot take pytest
down)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

from hetero.spec.types import AttentionMeta
from hetero.verify.inputs import compress as draw
from hetero.verify.oracles import clone_inputs
from hetero_cpu_ref import compress as ref

# fresh prompt, continuing chunk (start 6: window 1 spans the boundary), decodes closing a window or
# not, a padding sequence that would close windows, an empty sequence, a chunk past the ring
MIXED = [(13, 0), (5, 6), (1, 11), (1, 9), (6, 2, "pad"), (0, 5), (9, 30)]


def _tune(tile: int | None):
    from hetero.kernels.tuning import Tuning, TuningTable

    archs = {"test": {"kv_compress": {"TILE": tile}}} if tile else {}
    return Tuning(TuningTable(vendor="portable", archs=archs), "test", interpreted=True)


def _kernel():
    from hetero.kernels import compress

    return compress


def _check(got: dict, want: dict, dtype: torch.dtype) -> None:
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype != torch.bfloat16 else {"rtol": 1.6e-2, "atol": 1e-2}
    for k in ("kv_state", "gate_state"):
        assert torch.equal(got[k].isnan(), want[k].isnan()), k
        assert torch.equal(got[k].nan_to_num(), want[k].nan_to_num()), k  # exact copies
    g, w = got["comp_cache"], want["comp_cache"]
    assert torch.equal(g.isnan(), w.isnan())  # the same entries written, every other slot untouched
    torch.testing.assert_close(g.nan_to_num().float(), w.nan_to_num().float(), **tol)


@pytest.mark.parametrize(
    "d, ratio, overlap, rot, tile",
    [(40, 4, True, 8, None), (24, 8, False, 8, 64), (7, 3, True, 4, 16), (32, 4, True, 32, 32)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(d, ratio, overlap, rot, tile, dtype):
    """Tiles of 64 and 16 elements split HCA's 8 slots and the odd-D window into several online-softmax steps."""
    args = draw.kv_compress(d, ratio, overlap, MIXED, bsc=3, rot=rot)(torch.Generator().manual_seed(d), dtype)
    want, got = clone_inputs(args), clone_inputs(args)
    ref.kv_compress(**want)
    _kernel().kv_compress(**got, tuning=_tune(tile))
    _check(got, want, dtype)
    assert torch.equal(got["kv"], args["kv"]) and torch.equal(got["gate"], args["gate"])


def test_float64_bsc1_fused_views_and_cos_in_dtype():
    build = draw.kv_compress(16, 4, True, MIXED, bsc=1, rot=6, fused=True, cos_in_dtype=True)
    args = build(torch.Generator().manual_seed(3), torch.float64)
    assert args["kv"].stride(0) == 2 * args["kv"].shape[1]
    want, got = clone_inputs(args), clone_inputs(args)
    ref.kv_compress(**want)
    _kernel().kv_compress(**got, tuning=_tune(None))
    _check(got, want, torch.float64)


def test_entry_plan_lists_each_closing_window_once():
    meta = AttentionMeta.build([13, 5, 1, 1, 6, 0, 9], [13, 11, 12, 10, 8, 5, 39], [[0]] * 7)
    slots = torch.tensor([0, 1, 2, 3, -1, 4, 5], dtype=torch.int32)
    seq, w = _kernel().plan_entries(meta, slots, 4, 35)
    pairs = [(int(b), int(x)) for b, x in zip(seq, w) if x >= 0]
    assert pairs == [(0, 0), (0, 1), (0, 2), (1, 1), (2, 2), (6, 7), (6, 8)]
    assert w.shape[0] == 35 // 4 + 7 and (w[len(pairs) :] == -1).all()


def test_no_tokens_and_no_closing_window_write_nothing():
    for seqs in ([(0, 4), (0, 0)], [(2, 4), (1, 0), (1, 6, "pad")]):
        args = draw.kv_compress(16, 4, True, seqs, bsc=2, rot=4)(torch.Generator().manual_seed(1), torch.float32)
        got = clone_inputs(args)
        _kernel().kv_compress(**got, tuning=_tune(None))
        assert got["comp_cache"].isnan().all()
        want = clone_inputs(args)
        ref.kv_compress(**want)
        _check(got, want, torch.float32)


def test_validated_ops_reject_a_bad_block_id(validated_ops):
    from hetero.errors import OpError

    args = draw.kv_compress(16, 4, True, MIXED, bsc=3, rot=4)(torch.Generator().manual_seed(2), torch.float32)
    table = args["meta"].block_table.clone()
    table[0, 0] = 10**6
    args["meta"] = dataclasses.replace(args["meta"], block_table=table)
    with pytest.raises(OpError, match="meta.block_table"):
        validated_ops.kv_compress(**args)


# ------------------------------------------------------------------ memory safety, validation off

BIG = 10**6
SENTINEL = -7777.0
PAD = 2048
_BAD = {  # (query lens, seq lens, block table, state slots): each breaks one index of a valid batch
    "valid": ([5, 1, 3], [9, 4, 3], [[0, 1], [2, 3], [4, 5]], [0, 1, 2]),
    "block_huge": ([5, 1, 3], [9, 4, 3], [[0, BIG], [2, 3], [4, 5]], [0, 1, 2]),
    "block_negative": ([5, 1, 3], [9, 4, 3], [[-BIG, 1], [-1, 3], [4, 5]], [0, 1, 2]),
    "slot_huge": ([5, 1, 3], [9, 4, 3], [[0, 1], [2, 3], [4, 5]], [BIG, 1, -BIG]),
    "seq_len_huge": ([5, 1, 3], [BIG, 4, BIG], [[0, 1], [2, 3], [4, 5]], [0, 1, 2]),
    "seq_len_below_rows": ([5, 1, 3], [2, 0, 1], [[0, 1], [2, 3], [4, 5]], [0, 1, 2]),
    "qsl_decreasing": ([5, -4, 8], [9, 4, 3], [[0, 1], [2, 3], [4, 5]], [0, 1, 2]),
}


def _guarded(shape, fill):
    n = 1
    for s in shape:
        n *= s
    buf = torch.full((n + 2 * PAD,), fill)
    t = buf[PAD : PAD + n].view(*shape)
    t.copy_(torch.randn(shape))
    return t, (buf[:PAD], buf[-PAD:])


def _child() -> None:
    """Every malformed batch on guarded tensors: inputs inside NaN guards (a read past them makes a
    NaN entry), outputs inside sentinel guards (a write past them changes one)."""
    for name, (qlens, lens, table, slots) in _BAD.items():
        cu = [0]
        for n in qlens:
            cu.append(cu[-1] + n)
        meta = AttentionMeta(torch.tensor(cu, dtype=torch.int32), torch.tensor(lens, dtype=torch.int32),
                             torch.tensor(table, dtype=torch.int32), max(qlens), max(lens))  # fmt: skip
        t, d, m = 9, 8, 4
        kv, gate, cs = (_guarded(shape, float("nan"))[0] for shape in ((t, 2 * d), (t, 2 * d), (12, 4)))
        cache, cache_g = _guarded((6, 2, d), SENTINEL)
        kvs, kvs_g = _guarded((3, 2 * m, 2 * d), SENTINEL)
        gs, gs_g = _guarded((3, 2 * m, 2 * d), SENTINEL)
        try:
            _kernel().kv_compress(kv, gate, torch.randn(m, 2 * d), torch.ones(d), cs, cache, kvs, gs, meta,
                                  torch.tensor(slots, dtype=torch.int32), ratio=m, overlap=True, eps=1e-6,
                                  tuning=_tune(None))  # fmt: skip
        except Exception as e:  # a clean raise is fine here: the validating layer names the error
            print("CASE", name, "raised", type(e).__name__, flush=True)
            continue
        wrote_out = any(not (g == SENTINEL).all() for g in (*cache_g, *kvs_g, *gs_g))
        read_out = any(x.isnan().any() for x in (cache, kvs, gs))
        print("CASE", name, "POISON" if wrote_out else "", "NONFINITE" if read_out else "", flush=True)


def test_malformed_metadata_is_memory_safe():
    env = dict(os.environ, HETERO_TRITON_INTERPRET="1", TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run([sys.executable, __file__, "child"], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("CASE ")]
    assert {ln.split()[1] for ln in lines} == set(_BAD)
    assert not [ln for ln in lines if "POISON" in ln or "NONFINITE" in ln]


if __name__ == "__main__" and sys.argv[1:] == ["child"]:
    _child()
