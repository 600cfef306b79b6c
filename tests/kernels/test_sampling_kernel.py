"""The Triton rejection_sample kernel against the reference, through Triton's interpreter on CPU tensors:
every mode on one small mixed batch, both tilings (the interpreter's and a GPU's portable defaults),
bit-exact, and each request's tokens independent of the batch it is in."""

from __future__ import annotations

import pytest
import torch

from hetero_cpu_ref import sampling as ref


@pytest.fixture(params=["interpreter", "gpu-tiles"])
def tune(request, triton_backend):
    from hetero.kernels.tuning import Tuning, TuningTable

    if request.param == "interpreter":
        return triton_backend.tune
    return Tuning(TuningTable(vendor="portable"), "generic", interpreted=False)


def _batch(g: torch.Generator, ks: list[int], vocab: int) -> dict:
    n, b = sum(ks), len(ks)
    logits = 3 * torch.randn(n, vocab, generator=g)
    p = torch.softmax(logits, -1)
    x = torch.where(torch.rand(n, generator=g) < 0.6, p.argmax(-1), torch.randint(0, vocab, (n,), generator=g))
    return {
        "draft_token_ids": x.int(),
        "cu_num_draft_tokens": torch.tensor([0, *torch.tensor(ks).cumsum(0).tolist()], dtype=torch.int32),
        "target_probs": p,
        "bonus_token_ids": torch.randint(0, vocab, (b,), generator=g, dtype=torch.int32),
        "draft_probs": torch.softmax(logits + torch.randn(n, vocab, generator=g), -1),
        "max_spec_len": max(ks) + 1,
        "is_greedy": torch.rand(b, generator=g) < 0.3,
        "seeds": torch.randint(-(2**63), 2**63 - 1, (b,), generator=g, dtype=torch.int64),
    }


@pytest.mark.parametrize("mode", ["greedy", "random", "draft_free"])
def test_kernel_is_bit_exact_with_the_reference(tune, mode):
    from hetero.kernels.sampling import rejection_sample

    args = _batch(torch.Generator().manual_seed(7), [3, 0, 5, 1, 4, 2], 300)  # 300: a partial vocabulary tile
    if mode == "greedy":
        args["is_greedy"] = args["seeds"] = None
    if mode == "draft_free":
        args["draft_probs"] = None
    want = ref.rejection_sample(**args)
    assert torch.equal(rejection_sample(**args, tuning=tune), want)
    assert (want >= -1).all() and (want[:, 0] >= 0).all()  # every request emits at least one token


def test_a_request_draws_the_same_tokens_in_any_batch(triton_backend):
    from hetero.kernels.sampling import rejection_sample

    args = _batch(torch.Generator().manual_seed(3), [4, 2, 6], 64)
    args["is_greedy"][:] = False
    whole = rejection_sample(**args, tuning=triton_backend.tune)
    alone = {
        **args,
        "cu_num_draft_tokens": torch.tensor([0, 6], dtype=torch.int32),
        "bonus_token_ids": args["bonus_token_ids"][2:],
    }
    alone.update(is_greedy=args["is_greedy"][2:], seeds=args["seeds"][2:])
    for key in ("draft_token_ids", "target_probs", "draft_probs"):
        alone[key] = args[key][6:]
    assert torch.equal(rejection_sample(**alone, tuning=triton_backend.tune)[0], whole[2])
