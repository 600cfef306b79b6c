"""``hetero bench``'s packed int4 (W4A16, spec 1.9) cases, drawn by the conformance catalog's builders
(``hetero.verify.inputs.int4``): Kimi-K2.5's experts (hidden 7168, moe_intermediate 2048, 384 experts
top-8, symmetric group 32) and Qwen3-30B-A3B's as AWQ ships them (zero points, group 128).

``full``: the shared-expert-shaped gate_up GEMM at a 4096-token prefill and a 64-token decode batch,
Kimi-K2's gate_up under expert parallelism 8 (48 local experts, 4096 routed rows), and both models'
fused experts at 64 tokens (Kimi-K2's moe_intermediate shrunk to 256, as DeepSeek-V3's bfloat16 case
shrinks it: 384 full experts would be 10 GB of inputs to draw). ``quick``: the GEMMs with N shrunk to 64,
4 local experts, and Qwen3-30B-A3B's experts only (8 of them, I 64): the reference unpacks every code.
"""

from __future__ import annotations

from typing import Any, Callable

from hetero.verify.inputs import int4 as _int4

__all__ = ["int4_cases"]

#: Kimi-K2 / K2.5 (E, top_k, H, I, group) and Qwen3-30B-A3B's AWQ experts
KIMI, QWEN = (384, 8, 7168, 2048, 32), (128, 8, 2048, 768, 128)


def _static(dt: str, group: int, **extra: Any) -> dict[str, Any]:
    return {"dtype": dt, "weight_dtype": "int4", "group_size": group, **extra}


def int4_cases(add: Callable[..., None], full: bool, dt: str) -> None:
    """gemm, grouped_gemm and fused_moe on packed int4 weights."""
    e, k, h, i, g = KIMI
    n = 2 * i if full else 64
    for m in (4096, 64) if full else (16,):
        static = _static(dt, g, n=n, k=h, b_zero_point=False, bias=False)
        add("gemm", f"kimi-k2-gate-up-w4a16-g{g}-n{n}-t{m}", _int4.gemm(m, n, h, g), static)
    local, rows = (e // 8, 4096) if full else (4, 32)
    static = _static(dt, g, num_experts=local, n=n, k=h, b_zero_point=False)
    add(
        "grouped_gemm",
        f"kimi-k2-gate-up-ep8-w4a16-g{g}-g{local}-n{n}-t{rows}",
        _int4.grouped(rows, local, n, h, g),
        static,
    )
    models = (("kimi-k2", KIMI, False), ("qwen3-30b-a3b", QWEN, True)) if full else (("qwen3-30b-a3b", QWEN, True),)
    for model, (e, k, h, i, g), zp in models:
        e, i, t = (e, 256 if model == "kimi-k2" else i, 64) if full else (8, 64, 16)
        static = _static(dt, g, num_experts=e, top_k=k, hidden=h, intermediate=i, activation="silu")
        static.update(w13_zero_point=zp, w2_zero_point=zp)
        name = f"{model}-w4a16-g{g}{'-zp' if zp else ''}-e{e}-i{i}-t{t}"
        add("fused_moe", name, _int4.fused(t, e, k, h, i, g, (), zero_point=zp), static)
