"""ep_dispatch + local expert MLP + ep_combine on 2 and 4 gloo ranks equals fused_moe on the whole batch."""

from __future__ import annotations

import _workers

from hetero.distributed import spawn

QWEN3 = dict(experts=128, top_k=8, hidden=64, inter=32, scoring="softmax", seed=1)
DSV3 = dict(experts=256, top_k=8, hidden=64, inter=16, scoring="sigmoid", n_group=8, topk_group=4, scale=2.5, seed=2)


def test_two_ranks_qwen3_and_deepseek_v3_and_bad_expert_count():
    """Qwen3-30B-A3B-like (128 experts, top-8) and DeepSeek-V3-like (256, top-8, 8 groups) routing;
    E % R != 0 raises OpError."""
    spawn(_workers.ep_cases, 2, [{**QWEN3, "tokens": [13, 7]}, {**DSV3, "tokens": [6, 11]}, "bad_experts"])


def test_four_ranks_with_empty_ranks_and_empty_experts():
    """Rank 1 holds no tokens; in the last case only rank 1 has tokens (2), so most experts and three ranks get none."""
    spawn(
        _workers.ep_cases,
        4,
        [
            {**QWEN3, "tokens": [9, 0, 17, 5]},
            {**DSV3, "tokens": [4, 0, 12, 7]},
            dict(experts=64, top_k=2, hidden=16, inter=8, seed=3, tokens=[0, 2, 0, 0]),
        ],
    )


def test_reference_and_triton_backends_bind_the_spec_signatures():
    from hetero.kernels.backend import TritonBackend
    from hetero.spec import OPS
    from hetero_cpu_ref.plugin import CpuRefBackend

    for cls in (CpuRefBackend, TritonBackend):
        assert {"ep_dispatch", "ep_combine"} <= set(cls.native_ops())
        backend = cls(device="meta")
        for op in ("ep_dispatch", "ep_combine"):
            assert OPS[op].check_signature(getattr(backend, op)) is None, (cls, op)
