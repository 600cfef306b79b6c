"""Cases of the recurrent ops with per-token state slots (spec 1.11): speculative decoding's verify
calls, 1 + k rows per sequence with k mixed across the batch, the state kept after every row.

Shapes are Qwen3-Next-80B-A3B's linear-attention layers (16 key heads and 32 value heads of 128,
conv width 4, C = 8192; the MTP checkpoints speculative decoding serves), the conv whole, the delta
rule whole in the full tier and as one rank's heads under tensor parallelism of 8 (``tp8``) for the
quick tier and the wider batches; KDA at Kimi-Linear's. Every sequence names a slot per column
(``hetero.verify.inputs.recurrent_tokens``), so a write to the wrong column, past a sequence's
rows or after a -1 entry, and a read of the wrong column, change a compared state. Edge cases of
their own: M = 1 (a decode batch, which must equal the [N] form), num_accepted_tokens None (column 0),
a -1 entry among a sequence's writes, a skipped sequence whose other columns name real slots, a
sequence that reads the column it writes first (its read happens before), NaN slots without an
initial state, an empty sequence, and k = 7 (M = 8).
"""

from __future__ import annotations

from typing import Any, Sequence

from hetero.verify.case import Case
from hetero.verify.inputs import recurrent_tokens as draw
from hetero.verify.inputs.recurrent_draw import LINEAR, Linear
from hetero.verify.inputs.recurrent_tokens import TokenSeq

__all__ = ["cases"]

FLOATS = ("float32", "float16", "bfloat16")

# k = 3 (M = 4): every acceptance count read back (a = 1..4), L from 0 to M, a fresh sequence, a -1
# write, a skipped one over real slots, NaN slots, and a = 1 with L = 2 (reads the slot it writes first).
VERIFY: Sequence[TokenSeq] = (
    (4, "init", 4),
    (2, "init", 1),
    (1, "init", 3),
    (3, "fresh", 1),
    (4, "hole", 3),
    (4, "pad", 2),
    (3, "nan", 1),
    (0, "init", 2),
)
# The same kinds in fewer slots, for whole-model heads (2 MiB a slot), M = 3.
VERIFY_FEW: Sequence[TokenSeq] = ((3, "init", 3), (2, "init", 1), (3, "hole", 1), (1, "pad", 2))
# M = 1: a decode batch in per-token form (the [N] form's result).
DECODE_M1: Sequence[TokenSeq] = ((1, "init", 1),) * 3 + ((1, "fresh", 1), (1, "pad", 1))
# num_accepted_tokens None: every initial state from column 0.
COLUMN_ZERO: Sequence[TokenSeq] = ((4, "init", 1), (2, "init", 1), (3, "fresh", 1), (1, "init", 1))
# k = 7 (M = 8), rows 1 to 8.
VERIFY_M8: Sequence[TokenSeq] = ((8, "init", 5), (1, "init", 8), (5, "hole", 1), (7, "fresh", 1), (3, "init", 2))


def _case(op: str, shape: str, dt: str, lin: Linear, seqs: Sequence[TokenSeq], m: int, quick: bool, **kw: Any) -> Case:
    make = draw.conv_tokens if op == "causal_conv1d" else draw.gdr_tokens
    return Case(op, shape, dt, make(lin, seqs, m, **kw), draw.token_static(op, dt, lin, kw.get("width")), quick)


def _conv_cases(dt: str) -> list[Case]:
    qn, op = LINEAR["qwen3-next-80b-a3b"], "causal_conv1d"
    main = [_case(op, "qwen3-next-80b-a3b.spec-verify.m4", dt, qn, VERIFY, 4, dt == "float32")]
    return main + (
        [
            _case(op, "qwen3-next-80b-a3b.spec-verify.m1", dt, qn, DECODE_M1, 1, False),
            _case(op, "qwen3-next-80b-a3b.spec-verify.column-zero", dt, qn, COLUMN_ZERO, 4, False, accepted=False),
            _case(op, "qwen3-next-80b-a3b.spec-verify.m8", dt, qn, VERIFY_M8, 8, False),
            _case(op, "qwen3-next-80b-a3b.w2.spec-verify.m4", dt, qn, VERIFY, 4, False, width=2),
        ]
        if dt != "float16"
        else []
    )


def _gdr_cases(dt: str) -> list[Case]:
    qn, kimi, op = LINEAR["qwen3-next-80b-a3b"], LINEAR["kimi-linear-48b-a3b"], "gated_delta_rule"
    qn8 = qn.shard(8)
    main = [_case(op, "qwen3-next-80b-a3b.tp8.spec-verify.m4", dt, qn8, VERIFY, 4, dt == "bfloat16")]
    return (
        main
        + (
            [
                _case(op, "qwen3-next-80b-a3b.tp8.spec-verify.m1", dt, qn8, DECODE_M1, 1, False),
                _case(
                    op, "qwen3-next-80b-a3b.tp8.spec-verify.column-zero", dt, qn8, COLUMN_ZERO, 4, False, accepted=False
                ),
                _case(op, "qwen3-next-80b-a3b.tp8.spec-verify.m8", dt, qn8, VERIFY_M8, 8, False),
                _case(
                    op, "kimi-linear-48b-a3b.tp8.kda.spec-verify.m4", dt, kimi.shard(8), VERIFY, 4, False, beta_f32=True
                ),
            ]
            if dt != "float16"
            else []
        )
        + ([_case(op, "qwen3-next-80b-a3b.spec-verify.m3", dt, qn, VERIFY_FEW, 3, False)] if dt == "bfloat16" else [])
    )


def cases() -> list[Case]:
    """Every per-token recurrent case: the k = 3 batches in three dtypes, the edge cases in float32 and
    bfloat16 (whole-model heads in bfloat16, the dtype the models ship in); one conv and one delta-rule
    case form the quick tier."""
    return [c for dt in FLOATS for c in (*_conv_cases(dt), *_gdr_cases(dt))]
