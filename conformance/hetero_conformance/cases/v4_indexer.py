"""Cases of indexer_topk over compressed keys (spec 1.8's ``compress_ratio``): DeepSeek-V4's CSA indexer.

Geometry is DeepSeek-V4's (Flash and Pro share it): 64 indexer heads of D 128, top-512, one entry per
m = 4 tokens (``hetero.verify.inputs.dsa_draw.DSA["deepseek-v4"]``). The index cache holds compressed
entries, ``seq_lens // 4`` per sequence, paged through their own block table; inputs are on the grid of
``dsa_draw`` (one exact answer under any float32-or-wider evaluation). Contexts run to 2900 tokens (725
entries) so decode rows choose 512 among more, exactly 512 (2051 tokens) or keep all; prefill rows
earlier than the first closed window see nothing (all -1), and a sequence of 3 tokens has no entry.
Chunked prefill and mixed batches put rows of one sequence on both sides of a window boundary, where the
rule ``j < (pos + 1) // m`` differs from its off-by-one variants. Compressed-cache block sizes 64, 16
and 1, the fp8 key format, exact ties and no tokens are cases of their own.
"""

from __future__ import annotations

from hetero.verify.case import Case
from hetero.verify.inputs import dsa as draw
from hetero.verify.inputs.dsa_draw import V4_CSA_RATIO
from hetero.verify.inputs.paged import FLOATS

__all__ = ["cases"]


def _indexer_cases(dt: str) -> list[Case]:
    f32, bf16 = dt == "float32", dt == "bfloat16"
    rows = [
        ("deepseek-v4.csa.decode.b3.ctx600-2900", 64, [(1, 2900), (1, 2051), (1, 600)], {}, bf16),
        ("deepseek-v4.csa.prefill.short", 64, [(37, 37), (3, 3)], {}, f32 or bf16),
        ("deepseek-v4.csa.mixed.bs16", 16, [(1, 2500), (30, 30), (0, 400), (1, 3), (9, 2090)], {}, bf16),
        ("deepseek-v4.csa.bs1.mixed.top32", 1, [(1, 300), (14, 14), (6, 150)], {"topk": 32}, f32),
        ("deepseek-v4.csa.chunked-prefill", 64, [(40, 2150)], {}, False),
        ("deepseek-v4.csa.chunked-prefill.window-edge", 64, [(13, 2063), (7, 2056)], {}, False),
        ("deepseek-v4.csa.fp8.decode.b2", 64, [(1, 2700), (1, 900)], {"fp8": True}, False),
        ("deepseek-v4.csa.ties.decode.b2", 64, [(1, 2800), (1, 2300)], {"pool": 16}, False),
        ("deepseek-v4.csa.t0", 64, [], {}, False),
    ]
    out = []
    for shape, bs, seqs, opts, quick in rows:
        static = {
            "dtype": dt,
            "num_heads": draw.V4.hi,
            "head_dim": draw.V4.d,
            "block_size": bs,
            "topk": opts.get("topk", draw.V4.topk),
            "index_scale": bool(opts.get("fp8")),
            "compress_ratio": V4_CSA_RATIO,
        }
        build = draw.indexer(draw.V4, bs, seqs, ratio=V4_CSA_RATIO, **opts)
        out.append(Case("indexer_topk", shape, dt, build, static, quick))
    return out


def cases() -> list[Case]:
    out: list[Case] = []
    for dt in FLOATS:
        out += _indexer_cases(dt)
    return out
