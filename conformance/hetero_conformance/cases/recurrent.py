"""Cases of the recurrent ops of linear-attention layers: causal_conv1d and gated_delta_rule (spec 1.2).

Head counts, head dims and conv widths are those of released checkpoints (Qwen3-Next-80B-A3B,
Qwen3.5 dense 0.8B / 27B and MoE 35B-A3B / 397B-A17B, Kimi-Linear in KDA mode; GVA ratios
1, 2, 3, 4); token counts are scaled down. Whole-model heads make each state slot 0.5-1M
floats, and the runner compares every slot, so those cases keep to a few sequences; the long
and wide batches (chunk boundaries, 16 decodes) use one rank's heads of Qwen3-Next or
Kimi-Linear under tensor parallelism of 8 (``tp8``: head dims and GVA ratio real, the heads
per rank those of an 8-GPU deployment).

Every batch names its sequences' state slots in a random order among more slots than it uses,
all filled with random values, so a read or write of the wrong slot changes a compared state.
Edge cases are cases of their own: sequences shorter than the conv state, decode batches,
chunk boundaries (63/64/65 and 127/128/129 rows, for kernels chunked by 64), prefill chunks
continuing a carried state next to first chunks, no initial state over NaN-filled slots,
padding slots (-1), empty sequences, no tokens, q/k/v as strided views of one projection,
and use_qk_l2norm off with unit-norm inputs.
"""

from __future__ import annotations

from typing import Any, Sequence

from hetero.verify.case import Case
from hetero.verify.inputs import recurrent as draw
from hetero.verify.inputs.recurrent_draw import LINEAR, Linear, Seq

__all__ = ["cases"]

FLOATS = ("float32", "float16", "bfloat16")

# A prefill from zeros, a prefill chunk continuing its state, decodes, a sequence shorter than the
# conv state (W-1 = 3), an empty sequence on a real slot, and a padding slot.
MIXED: Sequence[Seq] = ((20, "fresh"), (9, "init"), (1, "init"), (1, "init"), (2, "init"), (0, "init"), (3, "pad"))
# The same kinds but the empty sequence, in fewer slots, for whole-model heads.
MIXED_FEW: Sequence[Seq] = ((12, "fresh"), (5, "init"), (1, "init"), (2, "pad"))
DECODE_B4: Sequence[Seq] = ((1, "init"),) * 3 + ((1, "pad"),)
DECODE_B16: Sequence[Seq] = ((1, "init"),) * 15 + ((1, "pad"),)
CHUNKS_64: Sequence[Seq] = ((63, "fresh"), (64, "init"), (65, "init"))
CHUNKS_128: Sequence[Seq] = ((127, "init"), (128, "fresh"), (129, "init"))
# A prompt's later chunk (its state carried from the chunk before) next to another prompt's first
# chunk and two decodes, as a chunked-prefill scheduler batches them.
CHUNKED_PREFILL: Sequence[Seq] = ((1, "init"), (96, "init"), (40, "fresh"), (1, "init"))
# Recycled slots full of NaN: has_initial_state False must never read them; an empty sequence leaves its slot as it is.
NAN_SLOTS: Sequence[Seq] = ((5, "nan"), (1, "nan"), (3, "init"), (0, "nan"), (2, "pad"))
NO_TOKENS: Sequence[Seq] = ((0, "init"), (0, "fresh"))


def _conv_cases(dt: str) -> list[Case]:
    names = ("qwen3-next-80b-a3b", "qwen3.5-27b", "qwen3.5-397b-a17b", "qwen3.5-0.8b", "kimi-linear-48b-a3b")
    qn, q27, q397, q08, kimi = (LINEAR[m] for m in names)
    qn8 = qn.shard(8)
    quick = dt in ("float32", "bfloat16")

    def case(shape: str, lin: Linear, seqs: Sequence[Seq], quick_case: bool = False, **kw: Any) -> Case:
        static = draw.conv_static(dt, lin, kw.get("width"), kw.get("bias", False), kw.get("activation", "silu"))
        return Case("causal_conv1d", shape, dt, draw.conv(lin, seqs, **kw), static, quick_case)

    return [
        case("qwen3-next-80b-a3b.mixed", qn, MIXED, quick),
        case("qwen3-next-80b-a3b.decode.b16", qn, DECODE_B16, dt == "bfloat16"),
        case("qwen3-next-80b-a3b.qkvz-view.mixed", qn, MIXED, view=True),
        case("qwen3.5-27b.mixed", q27, MIXED),
        case("qwen3.5-397b-a17b.decode.b16", q397, DECODE_B16),
        case("qwen3.5-0.8b.mixed", q08, MIXED),
        case("kimi-linear-48b-a3b.mixed", kimi, MIXED),
        case("qwen3-next-80b-a3b.tp8.chunks-63-64-65", qn8, CHUNKS_64),
        case("qwen3-next-80b-a3b.tp8.chunks-127-128-129", qn8, CHUNKS_128),
        case("qwen3-next-80b-a3b.tp8.chunked-prefill", qn8, CHUNKED_PREFILL),
        case("qwen3-next-80b-a3b.w2.mixed", qn, MIXED, width=2),
        case("qwen3-next-80b-a3b.w3.mixed", qn, MIXED, width=3),
        case("qwen3-next-80b-a3b.bias.no-activation", qn, MIXED, bias=True, activation=None),
        case("qwen3-next-80b-a3b.nan-slots", qn, NAN_SLOTS),
        case("qwen3-next-80b-a3b.t0", qn, NO_TOKENS),
    ]


def _gdr_cases(dt: str) -> list[Case]:
    names = (
        "qwen3-next-80b-a3b",
        "qwen3.5-0.8b",
        "qwen3.5-27b",
        "qwen3.5-35b-a3b",
        "qwen3.5-397b-a17b",
        "kimi-linear-48b-a3b",
    )
    qn, q08, q27, q35, q397, kimi = (LINEAR[m] for m in names)
    qn8, kimi8 = qn.shard(8), kimi.shard(8)

    def case(shape: str, lin: Linear, seqs: Sequence[Seq], quick_case: bool = False, **kw: Any) -> Case:
        static = draw.gdr_static(dt, lin, kw.get("l2norm", True))
        return Case("gated_delta_rule", shape, dt, draw.gdr(lin, seqs, **kw), static, quick_case)

    whole = (
        [  # whole-model heads: float32 and bfloat16 (the dtype these models ship in); float16 on the tp8 cases
            case("qwen3-next-80b-a3b.mixed", qn, MIXED_FEW, dt == "bfloat16"),
            case("qwen3-next-80b-a3b.decode.b4", qn, DECODE_B4),
            case("qwen3.5-0.8b.gva1.mixed", q08, MIXED_FEW),
            case("qwen3.5-27b.gva3.mixed", q27, MIXED_FEW),
            case("qwen3.5-35b-a3b.beta-f32.decode.b4", q35, DECODE_B4, beta_f32=True),
            case("qwen3.5-397b-a17b.gva4.mixed", q397, ((9, "fresh"), (3, "init"), (1, "pad"))),
            case("kimi-linear-48b-a3b.kda.mixed", kimi, MIXED_FEW, beta_f32=True),
        ]
        if dt != "float16"
        else []
    )
    return whole + [
        case("qwen3-next-80b-a3b.tp8.decode.b16", qn8, DECODE_B16, dt == "bfloat16"),
        case("qwen3-next-80b-a3b.tp8.contiguous.mixed", qn8, MIXED, dt == "float32", views=False),
        case("qwen3-next-80b-a3b.tp8.chunks-63-64-65", qn8, CHUNKS_64, dt == "bfloat16"),
        case("qwen3-next-80b-a3b.tp8.chunks-127-128-129", qn8, CHUNKS_128),
        case("kimi-linear-48b-a3b.tp8.kda.chunks-63-64-65", kimi8, CHUNKS_64, dt == "float32", beta_f32=True),
        case("kimi-linear-48b-a3b.tp8.kda.decode.b16", kimi8, DECODE_B16, beta_f32=True),
        case("qwen3-next-80b-a3b.tp8.chunked-prefill", qn8, CHUNKED_PREFILL),
        case("qwen3-next-80b-a3b.tp8.l2norm-off", qn8, MIXED, l2norm=False),
        case("qwen3-next-80b-a3b.tp8.nan-slots", qn8, NAN_SLOTS),
        case("qwen3-next-80b-a3b.tp8.t0", qn8, NO_TOKENS),
    ]


def cases() -> list[Case]:
    """Every recurrent case, three dtypes each; a few fp32/bf16 ones form the quick tier."""
    return [c for dt in FLOATS for c in (*_conv_cases(dt), *_gdr_cases(dt))]
