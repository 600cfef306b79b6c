"""Compressed attention (DeepSeek-V4): KV entries pooled over windows of tokens, attended beside a sliding window.

A DeepSeek-V4 attention layer keeps one shared K=V head per token (``head_dim`` D = 512, MQA) and
attends over the last ``window`` of those raw rows plus **compressed entries**: every ``ratio`` (m)
tokens, ``kv_compress`` pools a window of projected rows into one entry of a paged compressed cache
(transformers' ``DeepseekV4HCACompressor``, m = 128, and ``DeepseekV4CSACompressor``, m = 4 with
overlapping windows). ``compressed_attention`` then reads both in one softmax with per-head sinks. The
CSA layers' lightning indexer runs its own ``kv_compress`` (D = 128) into an index cache and picks
entries with ``indexer_topk(compress_ratio=m)``.

Shapes and conventions are those of ``hetero.spec.attention``: T query rows packed token-major in B
sequences, ``meta`` an ``AttentionMeta`` whose ``seq_lens`` count **tokens** (the new ones included),
a row of a sequence with n new rows and L tokens at position ``L - n + i``. Compressed entry w of a
sequence is the pool of the window that ends at token ``(w + 1) * m - 1``; the sequence holds
``seq_lens[b] // m`` of them after ``kv_compress`` ran on its new tokens, entry w in block
``comp_block_table[b, w // BSc]`` at offset ``w % BSc`` of a compressed cache ``[NBc, BSc, D]``.
Entry w is visible to a row at ``pos`` iff its window has closed by then: ``w < (pos + 1) // m``.
"""

from __future__ import annotations

import torch

from hetero.spec._op import Output, spec_op
from hetero.spec.types import AttentionMeta

__all__ = ["kv_compress", "compressed_attention"]


@spec_op(
    returns=(),
    mutates=(Output("comp_cache"), Output("kv_state", "exact"), Output("gate_state", "exact")),
)
def kv_compress(
    kv: torch.Tensor,
    gate: torch.Tensor,
    position_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    comp_cache: torch.Tensor,
    kv_state: torch.Tensor,
    gate_state: torch.Tensor,
    meta: AttentionMeta,
    state_slots: torch.Tensor,
    *,
    ratio: int,
    overlap: bool,
    eps: float,
) -> None:
    """Pool every window of ``ratio`` tokens that closes in this call into one normed, roped compressed entry.

    With C = 2 when ``overlap`` (CSA) else 1 (HCA), m = ``ratio`` >= 1 and R = C * m:
    kv [T, C*D] and gate [T, C*D] of one float dtype (the compressor's ``kv_proj`` / ``gate_proj``
    outputs); position_bias float32 [m, C*D]; norm_weight float32 [D]; cos_sin_cache [P, rot]
    (float32 or kv's dtype; cos in columns [0, rot/2), sin in [rot/2, rot); rot even, 2 <= rot <= D;
    any yarn scaling folded in); comp_cache [NBc, BSc, D] of kv's dtype; kv_state [S, R, C*D] of kv's
    dtype and gate_state [S, R, C*D] of gate's dtype; ``meta.block_table`` is the compressed
    cache's block table (``comp_block_table``); state_slots int32 [B] in [-1, S).

    Sequence b (rows s..e-1, n = e - s new tokens, L = seq_lens[b], start = L - n, slot p =
    state_slots[b]) has the raw row of token q, ``row(q) = (kv, gate)[s + q - start]`` for q >=
    start, and ``(kv_state, gate_state)[p, q % R]`` for ``start - R <= q < start`` (the state: the
    raw rows of its last R tokens, row q at ``q % R``). For each window w that closes in this call
    (``start <= (w + 1) * m - 1 < L``), in float32 or wider::

        slots: j < m (overlap only): token q = (w - 1) * m + j, half 0   # the previous window's Ca
               else:                 token q = w * m + j',      half C-1 # j' = j - (C - 1) * m, Cb
        logit[j, c] = gate_row(q)[half*D + c] + position_bias[q % m, half*D + c]
        a slot whose token q < 0 is absent (weight 0); weight = softmax over the present slots, per c
        pooled[c] = sum_j weight[j, c] * kv_row(q_j)[half_j*D + c]                 # [D]
        y = pooled * rsqrt(mean(pooled**2) + eps) * norm_weight
        rotate the LAST rot dims of y in interleaved pairs (2i, 2i+1) of dims D-rot.. by the angles
        of position w * m: (y1, y2) -> (y1*cos - y2*sin, y2*cos + y1*sin), cos/sin = row w*m's i-th
        comp_cache[comp_block_table[b, w // BSc], w % BSc] = y, rounded once to comp_cache's dtype

    Then the state keeps the last R raw rows: ``(kv_state, gate_state)[p, q % R] = row(q)`` for
    ``max(start, L - R) <= q < L``, exact copies (rows of older tokens are left as they are). A
    slot of -1 skips the sequence: nothing is read or written for it. A fresh sequence (start 0)
    reads no state row, so a new slot needs no reset; a sequence that starts at a prefix-cache hit
    (start > 0) needs the state its prefix left. One call serves prefill, chunked prefill (a window
    may span chunks: its earlier rows come from the state) and decode. Every cache slot and state
    row not named above is left untouched. Two sequences naming one slot or one entry slot is
    undefined. DeepSeek-V4: CSA m = 4, overlap, D = 512 (and its indexer's D = 128); HCA m = 128,
    no overlap; rot = 64, eps = rms_norm_eps.
    """


@spec_op(returns=("out", Output("lse", when="return_lse")))
def compressed_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    comp_cache: torch.Tensor,
    meta: AttentionMeta,
    comp_block_table: torch.Tensor,
    *,
    scale: float,
    window: int,
    ratio: int,
    sinks: torch.Tensor | None = None,
    topk_indices: torch.Tensor | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention over a sliding window of raw K=V rows and the compressed entries, in one softmax.

    query [T, H, D]; kv_cache [NB, BS, D] of the query's dtype: one shared head whose rows are both
    the keys and the values (token j at ``meta.block_table[b, j // BS]``, offset ``j % BS``);
    comp_cache [NBc, BSc, D] of the query's dtype, entries addressed by comp_block_table int32 (or
    int64, as meta's tables) [B, max_comp_blocks] as in the module docstring; ``ratio`` m >= 1;
    ``window`` W >= 1.

    A row at ``pos`` of sequence b sees raw row j iff ``pos - W < j <= pos`` (transformers'
    ``sliding_window`` of W keys, its own included), and compressed entry w iff ``w < (pos + 1) //
    m``: all such entries when ``topk_indices`` is None (HCA), else only those its row of
    ``topk_indices`` int32 (or int64) [T, K] lists (CSA's indexer; -1 padding and entries not
    visible are skipped; an entry listed twice is undefined). Logits ``scale * q . k``; values are
    the same rows. ``sinks`` float32 [H]: one logit per head that joins the softmax denominator and
    contributes no value (under TP the caller passes its own heads').

    Returns out [T, H, D] in the query's dtype, and with ``return_lse`` also lse float32 [T, H] =
    logsumexp of the visible logits (sinks excluded). A row that sees nothing gets out 0 and lse
    -inf. Accumulation is at least float32. DeepSeek-V4: D = 512, W = 128, m = 4 (with top-512
    indices) or 128, scale ``D ** -0.5``.
    """
