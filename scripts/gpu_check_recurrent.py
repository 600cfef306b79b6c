"""The per-token recurrent cases (spec 1.11) of scripts/gpu_check.py: speculative decoding's verify call at
Qwen3-Next-80B-A3B's linear-attention layers, a decode batch of B sequences verifying 1 + k rows each (k = 3,
mixed per sequence: 1 to 4 rows), the state kept after every row in per-token slots [B, 4] and read from
column num_accepted_tokens - 1 (mixed). The kernels: causal_conv1d's one part per sequence, gated_delta_rule's
token-by-token kernel storing S after each row.

Bytes: every input and output once, each initial state read once and each per-token state written once
(the roofline of a verify call: its states, 2 MiB each for the delta rule, dominate). Flops: as the decode
cases of ``gpu_check_cases._linear_attention``.
"""

from __future__ import annotations

import torch
from gpu_check_sizes import BF16, Bench, Sizes, nbytes, randn

__all__ = ["token_benches"]

M = 4  # 1 + k rows at most, k = 3


def _index(seqs: int, dev) -> tuple[dict[str, torch.Tensor], int, int]:
    """(the index tensors, rows T, states written): sequence n verifies 1 + n % M rows."""
    lens = [1 + n % M for n in range(seqs)]
    starts = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    index = {
        "query_start_loc": starts.to(dev),
        "state_slots": torch.randperm(seqs * M).to(torch.int32).view(seqs, M).to(dev),
        "has_initial_state": torch.ones(seqs, dtype=torch.bool, device=dev),
        "num_accepted_tokens": torch.randint(1, M + 1, (seqs,), dtype=torch.int32).to(dev),
    }
    return index, sum(lens), sum(lens)


def token_benches(s: Sizes) -> list[Bench]:
    """causal_conv1d and gated_delta_rule (per-head g) on per-token slots."""
    h, kd, hv, vd, c, w = s.linear
    b = s.linear_batch[0]

    def conv(dev):
        index, t, writes = _index(b, dev)
        x, weight, state = randn((t, c), dev), randn((c, w), dev, scale=w**-0.5), randn((b * M, w - 1, c), dev)
        inputs = {"x": x, "weight": weight, "bias": None, "conv_state": state, **index, "activation": "silu"}
        per_state = nbytes(state) // (b * M)
        return inputs, 2.0 * t * c * w, 2 * nbytes(x) + nbytes(weight) + (b + writes) * per_state

    def delta(dev):
        index, t, writes = _index(b, dev)
        q, k, v = randn((t, h, kd), dev), randn((t, h, kd), dev), randn((t, hv, vd), dev)
        g = torch.rand(t, hv, device=dev).mul_(-0.5).sub_(0.01)
        beta = torch.rand(t, hv, device=dev).to(BF16)
        state = torch.randn(b * M, hv, kd, vd, device=dev).mul_(0.1)  # float32
        inputs = {
            "q": q,
            "k": k,
            "v": v,
            "g": g,
            "beta": beta,
            "ssm_state": state,
            **index,
            "scale": kd**-0.5,
            "use_qk_l2norm": True,
        }
        per_state = nbytes(state) // (b * M)
        return inputs, t * hv * 6.0 * kd * vd, nbytes(q, k, v, g, beta, v) + (b + writes) * per_state

    heads = f"H{h} K{kd} HV{hv} V{vd}"
    return [
        Bench("causal_conv1d", f"spec-verify B{b} k{M - 1} C{c} W{w} per-token slots", "bfloat16", conv),
        Bench("gated_delta_rule", f"spec-verify B{b} k{M - 1} {heads} per-token slots", "bfloat16", delta),
    ]
