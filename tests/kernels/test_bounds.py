"""Memory safety of the Triton kernels on malformed index metadata, with validation off.

Each op family runs all its malformed calls in one child process under the interpreter, where an
out-of-bounds access through a bad index corrupts the heap or faults as it would on a GPU: a crash
fails the test instead of killing pytest. Every call must return or raise (any exception; the clean
OpError is the validating layer's job), and the child must exit 0. Tensors a call may write sit
between guard zones of a sentinel; a guard that changed is an out-of-bounds write. Input caches
are guarded with NaN, so a read just past their end shows up as a non-finite output.

The kernel modules read no index values on the host (that is hetero.spec.validate's job, in front
of them when validation is on), so the kernels' own masks are what runs here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

FAMILIES = ("paged", "mla", "varlen", "cache", "rotary", "grouped_gemm", "moe", "ep", "dsa", "quant", "int4")
BIG = 10**6


# ----------------------------------------------------------------------------- parent


@pytest.fixture(scope="module")
def children():
    """All families' children started at once (each pays the torch + triton import)."""
    env = dict(os.environ, HETERO_TRITON_INTERPRET="1", TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(sys.path))
    procs = {
        f: subprocess.Popen(
            [sys.executable, __file__, f], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for f in FAMILIES
    }
    yield procs
    for p in procs.values():
        if p.poll() is None:
            p.kill()


@pytest.mark.parametrize("family", FAMILIES)
def test_malformed_metadata_is_memory_safe(children, family):
    out, err = children[family].communicate(timeout=300)
    rc = children[family].returncode
    lines = out.splitlines()
    assert rc == 0, f"child for {family} died (rc {rc}) after:\n" + "\n".join(lines[-5:]) + "\n" + err[-3000:]
    planned = [ln.split()[1] for ln in lines if ln.startswith("PLAN ")]
    done = {ln.split()[1] for ln in lines if ln.startswith("CASE ")}
    assert planned and set(planned) == done, f"cases without a result: {sorted(set(planned) - done)}"
    bad = [ln for ln in lines if ln.startswith(("POISON ", "NONFINITE "))]
    assert not bad, "\n".join(bad)


def test_ascend_conversions_clamp_indices():
    """Every index hetero_ascend.convert hands to torch_npu lies inside its tensor, whatever came in
    (on CPU a bad index raises; on an NPU it would fault, so the clamp is what matters)."""
    cv = pytest.importorskip("hetero_ascend.convert", reason="hetero-ascend is not installed")
    import torch

    from hetero.spec import AttentionMeta

    meta = AttentionMeta(
        query_start_loc=torch.tensor([0, 7, 2, BIG], dtype=torch.int32),
        seq_lens=torch.tensor([-3, BIG, 5], dtype=torch.int32),
        block_table=torch.tensor([[0, BIG], [-1, 2], [5, 1]], dtype=torch.int32),
        max_query_len=7,
        max_seq_len=5,
    )
    q_ends, kv = cv.paged_lengths(meta, num_tokens=8, block_size=4)
    assert q_ends == [7, 7, 8] and kv == [0, 8, 5]
    assert cv.varlen_lengths(torch.tensor([0, 5, 3]), torch.tensor([0, BIG, -1]), num_tokens=4, num_keys=9) == (
        [4, 4],
        [9, 9],
    )
    assert cv.safe_block_table(meta.block_table, 6).tolist() == [[0, 0], [0, 2], [5, 1]]
    assert cv.safe_expert_ids(torch.tensor([[-1, 4], [BIG, 2]]), 4).tolist() == [[0, 3], [3, 2]]
    assert cv.group_list(torch.tensor([6, 2, BIG], dtype=torch.int32), 0, rows=9).tolist() == [6, 6, 9]
    assert cv.group_list(torch.tensor([-4, 3, 1], dtype=torch.int32), 1, rows=9).tolist() == [0, 3, 0]
    for f in (cv.perm_from_row_idx, cv.unpermute_indices):
        out = f(torch.tensor([BIG, -BIG, 1, 1]))
        assert out.shape == (4,) and int(out.min()) >= 0 and int(out.max()) < 4
    cache = torch.randn(16, 8)
    r1, r2 = cv.rotary_factors(torch.tensor([3, BIG, -1]), cache)
    assert r1.shape == (3, 1, 1, 8) and (r1[1:] == 1).all() and (r2[1:] == 0).all()
    torch.testing.assert_close(r1[0, 0, 0, :4], cache[3, :4])


# ----------------------------------------------------------------------------- child

SENTINEL = -7777.0
PAD = 4096


def _guarded(shape, fill, guard_value=SENTINEL):
    """A tensor of ``shape`` (float32, filled from ``fill``) between two guard zones of ``guard_value``."""
    import torch

    n = 1
    for s in shape:
        n *= s
    buf = torch.full((n + 2 * PAD,), guard_value)
    t = buf[PAD : PAD + n].view(*shape)
    t.copy_(fill(shape) if callable(fill) else torch.full(shape, float(fill)))
    return t, (buf[:PAD], buf[PAD + n :])


class Runner:
    def __init__(self):
        self.cases = []

    def add(self, name, fn):
        self.cases.append((name, fn))

    def run(self):
        import torch

        for name, _ in self.cases:
            print("PLAN", name, flush=True)
        for name, fn in self.cases:
            try:
                guards, outputs = fn()
            except Exception as e:  # any exception is a clean outcome here
                print("CASE", name, "raised", type(e).__name__, flush=True)
                continue
            print("CASE", name, "returned", flush=True)
            for g in guards:
                if not (torch.isnan(g).all() or (g == SENTINEL).all()):
                    print("POISON", name, "wrote outside its tensor", flush=True)
            for o in outputs:
                if not torch.isfinite(o).all():
                    print("NONFINITE", name, "read a NaN guard (out of bounds)", flush=True)


def _tuning():
    from hetero.kernels.tuning import Tuning, TuningTable

    small = {k: {"BLOCK_M": 16, "BLOCK_N": 16} for k in ("paged_attention", "varlen_attention", "mla_attention")}
    return Tuning(TuningTable(vendor="test", archs={"small": small}), "small", interpreted=True)


def _meta(qsl, seq_lens, table, max_q):
    import torch

    from hetero.spec import AttentionMeta

    return AttentionMeta(
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_table=torch.tensor(table, dtype=torch.int32),
        max_query_len=max_q,
        max_seq_len=max(seq_lens),
    )


# Paged metadata for 2 sequences (query 5 and 3 rows, T = 8), NB = 6 blocks of 4, 3 table columns.
_GOOD = dict(qsl=[0, 5, 8], seq_lens=[9, 6], table=[[0, 1, 2], [3, 4, 5]], max_q=5)
_PAGED_BAD = {
    "block_id_huge": dict(table=[[0, BIG, 2], [3, 4, 5]]),
    "block_id_negative": dict(table=[[0, 1, 2], [-BIG, 4, 5]]),
    "block_id_nb": dict(table=[[0, 6, 2], [3, 4, 6]]),
    "seq_len_past_table": dict(seq_lens=[13, BIG]),
    "seq_len_shorter_than_query": dict(seq_lens=[2, 1]),
    "seq_len_negative": dict(seq_lens=[-BIG, 6]),
    "qsl_decreasing": dict(qsl=[0, 7, 2]),
    "qsl_past_t": dict(qsl=[0, 5, BIG]),
    "qsl_short_of_t": dict(qsl=[0, 2, 4]),
    "qsl_negative_start": dict(qsl=[-BIG, 5, 8]),
    "qsl_huge_middle": dict(qsl=[0, BIG, 8]),
    "max_query_len_small": dict(max_q=1),
    "max_query_len_large": dict(max_q=BIG),
}


def _paged_cases(r, mla):
    import torch

    from hetero.kernels import attention as A

    g = torch.Generator().manual_seed(0)
    rnd = lambda shape: torch.randn(*shape, generator=g)  # noqa: E731
    for name, change in _PAGED_BAD.items():
        m = _meta(**{**_GOOD, **change})

        def call(m=m):
            if mla:
                ckv, _ = _guarded((6, 4, 32), rnd, float("nan"))
                kpe, _ = _guarded((6, 4, 16), rnd, float("nan"))
                out, lse = A.mla_attention(
                    rnd((8, 4, 32)), rnd((8, 4, 16)), ckv, kpe, m, scale=0.2, return_lse=True, tuning=_tuning()
                )
                return [], []
            kc, _ = _guarded((6, 4, 2, 16), rnd, float("nan"))
            vc, _ = _guarded((6, 4, 2, 16), rnd, float("nan"))
            out, guards = _guarded((8, 4, 16), 0.0)
            _, lse = A.paged_attention(
                rnd((8, 4, 16)), kc, vc, m, scale=0.2, out=out, return_lse=True, tuning=_tuning()
            )
            return guards, [out]

        r.add(name, call)
        if not mla:
            r.add(
                name + "_window",
                lambda m=m: (
                    A.paged_attention(
                        rnd((8, 4, 16)),
                        rnd((6, 4, 2, 16)),
                        rnd((6, 4, 2, 16)),
                        m,
                        scale=0.2,
                        causal=False,
                        window=(3, 2),
                        tuning=_tuning(),
                    ),
                    ([], []),
                )[1],
            )


def _varlen_cases(r):
    import torch

    from hetero.kernels import attention as A

    g = torch.Generator().manual_seed(1)
    rnd = lambda shape: torch.randn(*shape, generator=g)  # noqa: E731
    good_q, good_k = [0, 5, 8], [0, 9, 15]
    bad = {
        "cu_q_decreasing": (dict(cu_q=[0, 7, 2])),
        "cu_q_past_t": dict(cu_q=[0, 5, BIG]),
        "cu_q_short": dict(cu_q=[0, 1, 3]),
        "cu_q_negative": dict(cu_q=[-BIG, 5, 8]),
        "cu_k_decreasing": dict(cu_k=[0, 12, 3]),
        "cu_k_past_tk": dict(cu_k=[0, 9, BIG]),
        "cu_k_negative": dict(cu_k=[-5, 9, 15]),
        "cu_k_huge_start": dict(cu_k=[BIG, BIG + 2, 15]),
        "max_seqlen_small": dict(max_q=1),
        "max_seqlen_large": dict(max_q=BIG),
    }
    for name, change in bad.items():
        cu_q = torch.tensor(change.get("cu_q", good_q), dtype=torch.int32)
        cu_k = torch.tensor(change.get("cu_k", good_k), dtype=torch.int32)
        mq = change.get("max_q", 5)
        for causal in (True, False):

            def call(cu_q=cu_q, cu_k=cu_k, mq=mq, causal=causal):
                k, _ = _guarded((15, 2, 16), rnd, float("nan"))
                v, _ = _guarded((15, 2, 16), rnd, float("nan"))
                A.varlen_attention(
                    rnd((8, 4, 16)),
                    k,
                    v,
                    cu_q,
                    cu_k,
                    mq,
                    9,
                    scale=0.2,
                    causal=causal,
                    return_lse=True,
                    window=(-1, -1) if causal else (2, 3),
                    tuning=_tuning(),
                )
                return [], []

            r.add(f"{name}_{'causal' if causal else 'window'}", call)


def _cache_cases(r):
    import torch

    from hetero.kernels import cache

    tune = _tuning()
    for name, slot in {
        "slot_huge": 10**9,
        "slot_nb_bs": 24,
        "slot_minus_two": -2,
        "slot_very_negative": -(10**9),
    }.items():
        slots = torch.tensor([0, slot, 5], dtype=torch.int64)

        def kv(slots=slots):
            kc, gk = _guarded((6, 4, 2, 8), 0.0)
            vc, gv = _guarded((6, 4, 2, 8), 0.0)
            cache.write_kv(torch.randn(3, 2, 8), torch.randn(3, 2, 8), kc, vc, slots, tuning=tune)
            return gk + gv, []

        def mla(slots=slots):
            ckv, gc = _guarded((6, 4, 16), 0.0)
            kpe, gp = _guarded((6, 4, 8), 0.0)
            cache.write_mla_kv(torch.randn(3, 16), torch.randn(3, 8), ckv, kpe, slots, tuning=tune)
            return gc + gp, []

        r.add("write_kv_" + name, kv)
        r.add("write_mla_kv_" + name, mla)


def _rotary_cases(r):
    import torch

    from hetero.kernels import layers

    for name, pos in {"pos_huge": 10**9, "pos_max": 16, "pos_negative": -1, "pos_very_negative": -(10**12)}.items():
        positions = torch.tensor([0, pos, 3], dtype=torch.int64)

        def call(positions=positions):
            cs, _ = _guarded((16, 8), lambda s: torch.randn(*s), float("nan"))
            q, k = layers.rotary_embedding(
                positions, torch.randn(3, 2, 12), torch.randn(3, 1, 12), cs, tuning=_tuning()
            )
            return [], [q, k]

        r.add(name, call)


def _grouped_gemm_cases(r):
    import torch

    from hetero.kernels import gemm

    bad = {
        "decreasing": [6, 2, 9],
        "past_m": [3, 5, BIG],
        "negative": [-BIG, 4, 9],
        "huge_middle": [2, BIG, 9],
        "all_past_m": [BIG, BIG, BIG],
        "negative_end": [2, 5, -3],
    }
    for name, ends in bad.items():
        ge = torch.tensor(ends, dtype=torch.int32)

        def call(ge=ge):
            a, _ = _guarded((9, 16), lambda s: torch.randn(*s), float("nan"))
            c = gemm.grouped_gemm(a, torch.randn(3, 8, 16), ge, tuning=_tuning())
            return [], [c]

        r.add(name, call)


def _moe_cases(r):
    import torch

    from hetero.kernels import moe

    tune = _tuning()
    for name, bad in {"expert_e": 4, "expert_negative": -1, "expert_huge": BIG, "expert_very_negative": -BIG}.items():
        ids = torch.tensor([[0, 1], [bad, 2], [3, bad]], dtype=torch.int32)
        r.add("permute_" + name, lambda ids=ids: (moe.moe_permute(torch.randn(3, 8), ids, 4, tuning=tune), ([], []))[1])

        def fused(ids=ids):
            y = moe.fused_moe(
                torch.randn(3, 8), torch.randn(4, 12, 8), torch.randn(4, 8, 6), torch.rand(3, 2), ids, tuning=tune
            )
            return [], [y]

        r.add("fused_" + name, fused)

        def fused_biased(ids=ids):  # the spec 1.3 path: the biases are gathered by expert id too
            y = moe.fused_moe(
                torch.randn(3, 8),
                torch.randn(4, 12, 8),
                torch.randn(4, 8, 6),
                torch.rand(3, 2),
                ids,
                activation="swigluoai",
                limit=7.0,
                w13_bias=torch.randn(4, 12),
                w2_bias=torch.randn(4, 8),
                tuning=tune,
            )
            return [], [y]

        r.add("fused_biased_" + name, fused_biased)
    for name, perm in {
        "perm_huge": [0, 1, 2, 3, 4, BIG],
        "perm_negative": [0, -1, 2, 3, 4, 5],
        "perm_repeated": [0, 0, 1, 1, 2, 2],
        "perm_very_negative": [-BIG, 1, 2, 3, 4, 5],
    }.items():
        p = torch.tensor(perm, dtype=torch.int64)
        r.add(
            "unpermute_" + name,
            lambda p=p: (moe.moe_unpermute(torch.randn(6, 8), p, torch.rand(3, 2), tuning=tune), ([], []))[1],
        )


def _ep_cases(r):
    import torch

    from hetero import _ep
    from hetero.spec.comm import Communicator

    class Solo(Communicator):
        rank, world_size = 0, 1

        def all_reduce(self, x, op="sum"):
            return x.clone()

        def all_gather(self, x, dim=0):
            return x.clone()

        def reduce_scatter(self, x, dim=0):
            return x.clone()

        def all_to_all(self, x, out_splits, in_splits):
            return x.clone()

        def broadcast(self, x, src=0):
            return x

        def barrier(self):
            pass

    for name, bad in {"expert_e": 4, "expert_negative": -1, "expert_huge": BIG, "expert_very_negative": -BIG}.items():
        ids = torch.tensor([[0, 1], [bad, 2], [3, bad]], dtype=torch.int32)

        def call(ids=ids):
            d = _ep.ep_dispatch(torch.randn(3, 8), ids, torch.rand(3, 2), num_experts=4, comm=Solo())
            return [], [_ep.ep_combine(d.x * 2, d)]

        r.add(name, call)


def _dsa_cases(r):
    """indexer_topk and sparse mla_attention on every malformed metadata of the paged family (indices
    read through the table, NaN-guarded caches), sparse rows listing out-of-range positions, and
    write_index_k's bad slots in both formats."""
    import torch

    from hetero.kernels import attention as A
    from hetero.kernels import cache, dsa

    g = torch.Generator().manual_seed(2)
    rnd = lambda shape: torch.randn(*shape, generator=g)  # noqa: E731
    wild = torch.tensor([[0, BIG, -BIG, 5, 3], [-1, 11, 12, 2**31 - 1, -(2**31)]] * 4, dtype=torch.int32)
    for name, change in {**_PAGED_BAD, "good": {}}.items():
        m = _meta(**{**_GOOD, **change})

        def indexer(m=m):
            for fp8 in (False, True):
                kc, _ = _guarded((6, 4, 128), rnd, float("nan"))
                scale = _guarded((6, 4, 1), lambda s: torch.rand(*s), float("nan"))[0] if fp8 else None
                kc = kc.to(torch.float8_e4m3fn) if fp8 else kc  # (a copy: the guards stay on the float tensor)
                out = dsa.indexer_topk(
                    rnd((8, 4, 128)), rnd((8, 4)), kc, m, topk=6, index_scale=scale, tuning=_tuning()
                )
                if int(out.min()) < -1 or int(out.max()) >= 12:  # positions within the table's columns
                    print("POISON", "indexer", "returned a position outside the block table", flush=True)
            return [], []

        def sparse(m=m):
            ckv, _ = _guarded((6, 4, 32), rnd, float("nan"))
            kpe, _ = _guarded((6, 4, 16), rnd, float("nan"))
            out, guards = _guarded((8, 4, 32), 0.0)
            res = A.mla_attention(
                rnd((8, 4, 32)), rnd((8, 4, 16)), ckv, kpe, m, scale=0.2, topk_indices=wild, tuning=_tuning()
            )
            out.copy_(res)
            return guards, [out]

        r.add("indexer_" + name, indexer)
        r.add("sparse_mla_" + name, sparse)
    for name, slot in {
        "slot_huge": 10**9,
        "slot_nb_bs": 24,
        "slot_minus_two": -2,
        "slot_very_negative": -(10**9),
    }.items():
        slots = torch.tensor([0, slot, 5], dtype=torch.int64)

        def write(slots=slots):
            plain, gp = _guarded((6, 4, 128), 0.0)
            cache.write_index_k(torch.randn(3, 128), plain, slots, tuning=_tuning())
            fp8 = torch.zeros(6 * 4 * 128 + 2 * PAD, dtype=torch.uint8)
            scale, gs = _guarded((6, 4, 1), 0.0)
            cache.write_index_k(
                torch.randn(3, 128),
                fp8[PAD:-PAD].view(torch.float8_e4m3fn).view(6, 4, 128),
                slots,
                index_scale=scale,
                tuning=_tuning(),
            )
            bytes_ok = bool((fp8[:PAD] == 0).all() and (fp8[-PAD:] == 0).all())
            return [*gp, *gs] + ([] if bytes_ok else [torch.full((1,), 1.0)]), []

        r.add("write_index_k_" + name, write)


def _fp8_guarded(shape):
    """fp8 e4m3fn values of ``shape`` between guard zones of NaN bytes (0x7F): a read past them is a NaN output."""
    import torch

    n = shape[0] * shape[1]
    buf = torch.full((n + 2 * PAD,), 0x7F, dtype=torch.uint8)
    t = buf[PAD : PAD + n].view(torch.float8_e4m3fn).view(*shape)
    t.copy_(torch.randn(*shape).to(torch.float8_e4m3fn))
    return t


def _quant_cases(r):
    import torch

    from hetero.kernels import moe, quant

    tune = _tuning()
    bad = {
        "decreasing": [6, 2, 9],
        "past_m": [3, 5, BIG],
        "negative": [-BIG, 4, 9],
        "huge_middle": [2, BIG, 9],
        "negative_end": [2, 5, -3],
    }
    for name, ends in bad.items():
        ge = torch.tensor(ends, dtype=torch.int32)

        def call(ge=ge):
            a = _fp8_guarded((9, 160))
            b = torch.randn(3, 136, 160).to(torch.float8_e4m3fn)
            c = quant.scaled_grouped_gemm(a, b, torch.rand(9, 2) + 0.5, torch.rand(3, 2, 2) + 0.5, ge, tuning=tune)
            return [], [c]

        r.add("scaled_grouped_" + name, call)
    w13, s13 = torch.randn(4, 12, 8).to(torch.int8), torch.rand(4, 12, 1)
    w2, s2 = torch.randn(4, 8, 6).to(torch.int8), torch.rand(4, 8, 1)
    for name, bad_id in {"expert_e": 4, "expert_negative": -1, "expert_huge": BIG}.items():
        ids = torch.tensor([[0, 1], [bad_id, 2], [3, bad_id]], dtype=torch.int32)
        for act_quant in ("token", None):

            def fused(ids=ids, act_quant=act_quant):
                y = moe.fused_moe(
                    torch.randn(3, 8),
                    w13,
                    w2,
                    torch.rand(3, 2),
                    ids,
                    w13_scale=s13,
                    w2_scale=s2,
                    act_quant=act_quant,
                    tuning=tune,
                )
                return [], [y]

            r.add(f"fused_{act_quant}_{name}", fused)


def _int4_cases(r):
    """The packed int4 (W4A16) grouped GEMM and fused_moe: the same malformed group ends and expert ids."""
    import torch

    from hetero.kernels import gemm, moe

    tune = _tuning()
    packed = dict(b_scale=torch.rand(3, 8, 1) + 0.5, b_zero_point=torch.randint(0, 16, (3, 8, 1), dtype=torch.uint8))
    for name, ends in {"decreasing": [6, 2, 9], "past_m": [3, 5, BIG], "negative": [-BIG, 4, 9]}.items():
        ge = torch.tensor(ends, dtype=torch.int32)

        def call(ge=ge):
            a, _ = _guarded((9, 16), lambda s: torch.randn(*s), float("nan"))
            b = torch.randint(0, 256, (3, 8, 8), dtype=torch.uint8)
            return [], [gemm.grouped_gemm(a, b, ge, group_size=16, tuning=tune, **packed)]

        r.add("int4_grouped_" + name, call)
    w13, s13 = torch.randint(0, 256, (4, 12, 4), dtype=torch.uint8), torch.rand(4, 12, 1)
    w2, s2 = torch.randint(0, 256, (4, 8, 3), dtype=torch.uint8), torch.rand(4, 8, 1)
    for name, bad_id in {"expert_e": 4, "expert_negative": -1, "expert_huge": BIG}.items():
        ids = torch.tensor([[0, 1], [bad_id, 2], [3, bad_id]], dtype=torch.int32)

        def fused(ids=ids):
            x, w = torch.randn(3, 8), torch.rand(3, 2)
            return [], [moe.fused_moe(x, w13, w2, w, ids, w13_scale=s13, w2_scale=s2, group_size=8, tuning=tune)]

        r.add("int4_fused_" + name, fused)


def _child(family):
    r = Runner()
    {"paged": lambda: _paged_cases(r, mla=False), "mla": lambda: _paged_cases(r, mla=True),
     "varlen": lambda: _varlen_cases(r), "cache": lambda: _cache_cases(r), "rotary": lambda: _rotary_cases(r),
     "grouped_gemm": lambda: _grouped_gemm_cases(r),
     "moe": lambda: _moe_cases(r), "ep": lambda: _ep_cases(r), "dsa": lambda: _dsa_cases(r),
     "quant": lambda: _quant_cases(r), "int4": lambda: _int4_cases(r)}[family]()  # fmt: skip
    r.run()


if __name__ == "__main__":
    os.environ["HETERO_TRITON_INTERPRET"] = "1"  # before anything imports triton
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    _child(sys.argv[1])
