"""TritonBackend: every op of the spec through the portable Triton kernels.

A chip with a Triton compiler gets all ops by subclassing it and setting
``name``, ``device_type``, ``dist_backend``, ``tuning`` (a TuningTable) and, when
its architecture names differ from the default, ``arch()``. Nothing here imports
Triton until an op runs.
"""
from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Any, ClassVar

import torch

from hetero.backend import Availability, Backend
from hetero.kernels._triton import interpreter_requested, triton_missing_reason
from hetero.kernels.limits import kernel_reason
from hetero.kernels.tuning import Tuning, TuningTable
from hetero.spec import SPEC_VERSION, AttentionMeta

__all__ = ["TritonBackend"]


@functools.cache
def _family(name: str) -> ModuleType:
    return importlib.import_module(f"hetero.kernels.{name}")


class TritonBackend(Backend):
    """The portable Triton implementation of every op (``route`` stays in torch)."""

    spec_version = SPEC_VERSION
    tuning: ClassVar[TuningTable] = TuningTable(vendor="portable")

    def __init__(self, device: torch.device | str | None = None):
        if device is None and interpreter_requested():
            device = "cpu"
        super().__init__(device)
        self.interpreted = interpreter_requested()
        arch = "interpreter" if self.interpreted else ("meta" if self.device.type == "meta" else self.arch(self.device))
        self.tune = Tuning(self.tuning, arch, self.interpreted)

    @classmethod
    def arch(cls, device: torch.device) -> str:
        """The tuning-table key of ``device``; the default has none ("generic")."""
        return "generic"

    @classmethod
    def probe_interpreter(cls) -> Availability | None:
        """Under HETERO_TRITON_INTERPRET=1: available on CPU tensors (or why not); else None."""
        if not interpreter_requested():
            return None
        missing = triton_missing_reason()
        if missing:
            return Availability(ok=False, reason=f"HETERO_TRITON_INTERPRET=1 but {missing}")
        return Availability(ok=True, reason="interpreted on CPU (HETERO_TRITON_INTERPRET=1)", device_name="cpu (triton interpreter)",
                            details={"arch": "interpreter"})

    @classmethod
    def process_group_backend(cls) -> str:
        # interpreted kernels take CPU tensors, which only gloo moves
        return "gloo" if interpreter_requested() else cls.dist_backend

    def supports(self, op: str, **static: Any) -> str | None:
        """The portable kernels' own limits (dtype families, head dims, options); a vendor
        subclass puts its architecture's limits in front of these."""
        return kernel_reason(op, static)

    @classmethod
    def probe(cls) -> Availability:
        return cls.probe_interpreter() or Availability(ok=False, reason="the portable Triton backend needs a subclass for a device")

    # -- attention -----------------------------------------------------------------------
    def write_kv(self, key, value, k_cache, v_cache, slot_mapping) -> None:
        return _family("cache").write_kv(key, value, k_cache, v_cache, slot_mapping, tuning=self.tune)

    def paged_attention(self, query, k_cache, v_cache, meta: AttentionMeta, *, scale, causal=True, window=(-1, -1), softcap=0.0, sinks=None, out=None, return_lse=False) -> Any:
        return _family("attention").paged_attention(query, k_cache, v_cache, meta, scale=scale, causal=causal, window=window,
                                                    softcap=softcap, sinks=sinks, out=out, return_lse=return_lse, tuning=self.tune)

    def varlen_attention(self, query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, scale, causal=True, window=(-1, -1), softcap=0.0, return_lse=False) -> Any:
        return _family("attention").varlen_attention(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale=scale,
                                                     causal=causal, window=window, softcap=softcap, return_lse=return_lse, tuning=self.tune)

    def write_mla_kv(self, kv_c, k_pe, ckv_cache, kpe_cache, slot_mapping) -> None:
        return _family("cache").write_mla_kv(kv_c, k_pe, ckv_cache, kpe_cache, slot_mapping, tuning=self.tune)

    def mla_attention(self, q_nope, q_pe, ckv_cache, kpe_cache, meta: AttentionMeta, *, scale, causal=True, return_lse=False,
                      topk_indices=None) -> Any:
        return _family("attention").mla_attention(q_nope, q_pe, ckv_cache, kpe_cache, meta, scale=scale, causal=causal,
                                                  return_lse=return_lse, topk_indices=topk_indices, tuning=self.tune)

    def merge_attention(self, out_a, lse_a, out_b, lse_b) -> Any:
        return _family("cache").merge_attention(out_a, lse_a, out_b, lse_b, tuning=self.tune)

    def write_index_k(self, k, index_cache, slot_mapping, *, index_scale=None) -> None:
        return _family("cache").write_index_k(k, index_cache, slot_mapping, index_scale=index_scale, tuning=self.tune)

    def indexer_topk(self, q, weights, index_cache, meta: AttentionMeta, *, topk, index_scale=None) -> torch.Tensor:
        return _family("dsa").indexer_topk(q, weights, index_cache, meta, topk=topk, index_scale=index_scale, tuning=self.tune)

    # -- gemm ----------------------------------------------------------------------------
    def gemm(self, a, b, *, bias=None, out_dtype=None) -> torch.Tensor:
        return _family("gemm").gemm(a, b, bias=bias, out_dtype=out_dtype, tuning=self.tune)

    def scaled_gemm(self, a, b, a_scale, b_scale, *, bias=None, out_dtype=torch.bfloat16) -> torch.Tensor:
        return _family("gemm").scaled_gemm(a, b, a_scale, b_scale, bias=bias, out_dtype=out_dtype, tuning=self.tune)

    def grouped_gemm(self, a, b, group_ends, *, out_dtype=None) -> torch.Tensor:
        return _family("gemm").grouped_gemm(a, b, group_ends, out_dtype=out_dtype, tuning=self.tune)

    def quantize_activation(self, x, *, dtype, group_size=128, scale_fmt="float", asymmetric=False) -> Any:
        return _family("quant").quantize_activation(x, dtype=dtype, group_size=group_size, scale_fmt=scale_fmt,
                                                    asymmetric=asymmetric, tuning=self.tune)

    def scaled_grouped_gemm(self, a, b, a_scale, b_scale, group_ends, *, a_zero_point=None,
                            out_dtype=torch.bfloat16) -> torch.Tensor:
        return _family("quant").scaled_grouped_gemm(a, b, a_scale, b_scale, group_ends, a_zero_point=a_zero_point,
                                                    out_dtype=out_dtype, tuning=self.tune)

    # -- moe -----------------------------------------------------------------------------
    def route(self, router_logits, *, top_k, scoring="softmax", renormalize=True, n_group=1, topk_group=1, correction_bias=None, routed_scaling_factor=1.0) -> Any:
        return _family("moe").route(router_logits, top_k=top_k, scoring=scoring, renormalize=renormalize, n_group=n_group, topk_group=topk_group,
                                    correction_bias=correction_bias, routed_scaling_factor=routed_scaling_factor)

    def moe_permute(self, x, ids, num_experts) -> Any:
        return _family("moe").moe_permute(x, ids, num_experts, tuning=self.tune)

    def moe_unpermute(self, y_sorted, perm, weights) -> torch.Tensor:
        return _family("moe").moe_unpermute(y_sorted, perm, weights, tuning=self.tune)

    def fused_moe(self, x, w13, w2, weights, ids, *, activation="silu", alpha=1.702, limit=None, w13_bias=None,
                  w2_bias=None, w13_scale=None, w2_scale=None, act_quant=None, act_scale_fmt="float") -> torch.Tensor:
        return _family("moe").fused_moe(x, w13, w2, weights, ids, activation=activation, alpha=alpha, limit=limit,
                                        w13_bias=w13_bias, w2_bias=w2_bias, w13_scale=w13_scale, w2_scale=w2_scale,
                                        act_quant=act_quant, act_scale_fmt=act_scale_fmt, tuning=self.tune)

    def ep_dispatch(self, x, ids, weights, *, num_experts, comm) -> Any:
        from hetero import _ep  # collectives and index bookkeeping: device-agnostic torch, shared with the reference

        return _ep.ep_dispatch(x, ids, weights, num_experts=num_experts, comm=comm)

    def ep_combine(self, y_local, dispatch) -> torch.Tensor:
        from hetero import _ep

        return _ep.ep_combine(y_local, dispatch)

    # -- layers --------------------------------------------------------------------------
    def rms_norm(self, x, weight, eps, *, residual=None, weight_offset=0.0, gate=None, gate_act="silu") -> Any:
        return _family("layers").rms_norm(x, weight, eps, residual=residual, weight_offset=weight_offset, gate=gate,
                                          gate_act=gate_act, tuning=self.tune)

    def layer_norm(self, x, weight, bias, eps) -> torch.Tensor:
        return _family("layers").layer_norm(x, weight, bias, eps, tuning=self.tune)

    def rotary_embedding(self, positions, q, k, cos_sin_cache, *, is_neox=True) -> Any:
        return _family("layers").rotary_embedding(positions, q, k, cos_sin_cache, is_neox=is_neox, tuning=self.tune)

    def silu_and_mul(self, x) -> torch.Tensor:
        return _family("layers").silu_and_mul(x, tuning=self.tune)

    # -- recurrent (linear attention) -----------------------------------------------------
    def causal_conv1d(self, x, weight, bias, conv_state, query_start_loc, state_slots, has_initial_state, *, activation="silu") -> torch.Tensor:
        return _family("recurrent").causal_conv1d(x, weight, bias, conv_state, query_start_loc, state_slots, has_initial_state,
                                                  activation=activation, tuning=self.tune)

    def gated_delta_rule(self, q, k, v, g, beta, ssm_state, query_start_loc, state_slots, has_initial_state, *, scale, use_qk_l2norm=True) -> torch.Tensor:
        return _family("recurrent").gated_delta_rule(q, k, v, g, beta, ssm_state, query_start_loc, state_slots, has_initial_state,
                                                     scale=scale, use_qk_l2norm=use_qk_l2norm, tuning=self.tune)
