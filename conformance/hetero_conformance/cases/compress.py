"""Cases of kv_compress (spec 1.8): DeepSeek-V4's three compressors at their real widths.

V4-Flash and V4-Pro share them (the compressor's inputs are its kv/gate projections, so the hidden
size does not reach the op): CSA, m = 4 with overlapping windows, D = 512 (kv and gate 1024 wide);
HCA, m = 128, D = 512; the CSA indexer's own compressor, m = 4 with overlap, D = 128; rope on the
last 64 dims, rms_norm_eps 1e-6. Compressed-cache blocks of 64 entries (CSA, indexer: a 256-token
KV block) and 2 (HCA), and a cache of 1-entry blocks. Each batch names its sequences' state slots
in a random order among more slots than it uses (see ``hetero.verify.inputs.compress``).

Edge cases are cases of their own: a chunk continuing a populated ring whose first window spans the
boundary (its early rows come from the ring), decode rows that close a window and rows that do not,
a padding sequence (slot -1) whose rows would close windows, an empty sequence, sequences that close
no window, one call closing several windows (HCA: three, the first reaching back before token 0),
a chunk starting before R tokens (ring rows of tokens < 0 are NaN), T = 0, kv and gate as views of
one fused projection, cos_sin_cache in the case dtype.
"""

from __future__ import annotations

from typing import Any, Sequence

from hetero.verify.case import Case
from hetero.verify.inputs import compress as draw

__all__ = ["cases"]

FLOATS = ("float32", "float16", "bfloat16")
D, D_INDEX, ROT = 512, 128, 64
CSA, HCA = 4, 128

# fresh prompt (3 windows and a partial one), a chunk continuing at token 6 (window 1 spans the
# boundary), decodes that close window 2 and that close none, padding, an empty sequence, a later chunk
MIXED_M4 = ((13, 0), (5, 6), (1, 11), (1, 9), (6, 2, "pad"), (0, 5), (9, 30))
DECODE_M4 = tuple((1, s) for s in (3, 7, 10, 0, 4, 259, 1022, 5, 64, 127, 2, 99, 1, 6, 15)) + ((1, 11, "pad"),)
CHUNKED_M4 = ((64, 130), (13, 7), (2, 0), (1, 259))
NO_WINDOW_M4 = ((2, 4), (1, 0), (0, 5), (1, 5))
MIXED_M128 = ((100, 200), (1, 127), (5, 60), (3, 125, "pad"), (1, 383))
DECODE_M128 = ((1, 127), (1, 255), (1, 300), (1, 64), (1, 1023), (1, 0), (1, 511), (1, 383, "pad"))
THREE_WINDOWS_M128 = ((300, 100),)
NO_TOKENS = ((0, 4), (0, 0))


def _case(dt: str, shape: str, d: int, m: int, overlap: bool, seqs: Sequence, quick: bool = False, **kw: Any):
    bsc = kw.pop("bsc", 64 if m == CSA else 2)
    build = draw.kv_compress(d, m, overlap, seqs, bsc=bsc, rot=ROT, **kw)
    return Case("kv_compress", shape, dt, build, draw.kv_compress_static(dt, d, m, overlap, bsc), quick)


def _csa(dt: str, quick: bool) -> list[Case]:
    v4 = "deepseek-v4.csa"
    return [
        _case(dt, f"{v4}.mixed", D, CSA, True, MIXED_M4, quick),
        _case(dt, f"{v4}.prefill.t37", D, CSA, True, ((37, 0),)),
        _case(dt, f"{v4}.decode.b16", D, CSA, True, DECODE_M4, dt == "bfloat16"),
        _case(dt, f"{v4}.chunked-prefill", D, CSA, True, CHUNKED_M4),
        _case(dt, f"{v4}.bsc1.mixed", D, CSA, True, MIXED_M4, dt == "float32", bsc=1),
        _case(dt, f"{v4}.no-window", D, CSA, True, NO_WINDOW_M4),
        _case(dt, f"{v4}.t0", D, CSA, True, NO_TOKENS),
        _case(dt, f"{v4}.fused-views.cos-in-dtype", D, CSA, True, MIXED_M4, fused=True, cos_in_dtype=True),
    ]


def _hca(dt: str, quick: bool) -> list[Case]:
    v4 = "deepseek-v4.hca"
    return [
        _case(dt, f"{v4}.mixed", D, HCA, False, MIXED_M128, quick),
        _case(dt, f"{v4}.prefill.t300", D, HCA, False, ((300, 0),)),
        _case(dt, f"{v4}.decode.b8", D, HCA, False, DECODE_M128),
        _case(dt, f"{v4}.three-windows-from-100", D, HCA, False, THREE_WINDOWS_M128, dt == "bfloat16"),
        _case(dt, f"{v4}.bsc1.decode.b8", D, HCA, False, DECODE_M128, bsc=1),
        _case(dt, f"{v4}.t0", D, HCA, False, NO_TOKENS),
    ]


def _indexer(dt: str, quick: bool) -> list[Case]:
    v4 = "deepseek-v4.indexer"
    return [
        _case(dt, f"{v4}.mixed", D_INDEX, CSA, True, MIXED_M4, quick),
        _case(dt, f"{v4}.decode.b16", D_INDEX, CSA, True, DECODE_M4),
        _case(dt, f"{v4}.chunked-prefill", D_INDEX, CSA, True, CHUNKED_M4),
        _case(dt, f"{v4}.no-window", D_INDEX, CSA, True, NO_WINDOW_M4),
    ]


def cases() -> list[Case]:
    """Every kv_compress case, three dtypes each; the mixed batches in fp32/bf16 form the quick tier."""
    out: list[Case] = []
    for dt in FLOATS:
        quick = dt in ("float32", "bfloat16")
        out += _csa(dt, quick) + _hca(dt, quick) + _indexer(dt, quick)
    return out
