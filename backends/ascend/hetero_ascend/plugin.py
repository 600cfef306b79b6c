"""The ascend backend: documented torch_npu fused operators, the portable Triton kernels via triton-ascend, HCCL.

Selected as ``hetero.load("ascend")``. The ops in ``support.MAPPED`` call torch_npu; every
argument conversion lives in ``hetero_ascend.convert`` and is tested on CPU against a reference
written from the torch_npu docs. NONE of the torch_npu paths has run on an NPU yet: the probe
says so and every mapped method's docstring says so. The other ops are the Triton kernels
(TritonBackend) and run only where triton-ascend is installed; otherwise ``supports`` declines
them and the engine falls back to the reference. torch_npu is imported only inside functions.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import torch

import hetero
from hetero.kernels import TritonBackend
from hetero.spec.checks import (
    check_indexer_inputs,
    check_layer_norm,
    check_meta_shapes,
    check_mla_inputs,
    check_scaled_grouped,
    check_tensor,
    check_topk_indices,
)
from hetero.spec.types import FLOAT_DTYPES
from hetero_ascend import convert, ep, quant, sparse, support

__all__ = ["AscendBackend", "hetero_backends"]

#: The activation dtypes of the Triton kernels (float64 is the reference's).
_KERNEL_DTYPES = tuple(d for d in FLOAT_DTYPES if d is not torch.float64)


def _npu() -> Any:
    return importlib.import_module("torch_npu")


class AscendBackend(TritonBackend):
    """Huawei Ascend NPUs (Atlas A2/A3) through torch_npu; HCCL collectives."""

    name = "ascend"
    device_type = "npu"
    priority = 100
    dist_backend = "hccl"
    spec_version = hetero.SPEC_VERSION
    #: Ops mapped to torch_npu that have never run on an NPU (shown by the probe and by explain).
    UNVERIFIED_OPS = tuple(support.MAPPED)

    @classmethod
    def op_notes(cls) -> dict[str, str]:
        triton = "portable Triton kernel (needs triton-ascend); never run on an NPU"
        notes = {
            op: f"mapped to {support.target(op)}; {support.NEVER_RUN}" if op in support.MAPPED else triton
            for op in cls.native_ops()
        }
        for op in ("ep_dispatch", "ep_combine"):
            notes[op] = (
                f"mapped to {support.target(op)} where its documented limits allow, else the "
                f"portable hetero._ep path; {support.NEVER_RUN}"
            )
        notes.update(sparse_notes())
        for op, extra in quant.NOTES.items():
            if op in notes:
                notes[op] = f"{notes[op]}; {extra}"
        return notes

    @classmethod
    def probe(cls) -> hetero.Availability:
        if importlib.util.find_spec("torch_npu") is None:
            return hetero.Availability(ok=False, reason="torch_npu is not installed", details=cls._unverified())
        try:
            torch_npu = _npu()
            count = torch_npu.npu.device_count() if torch_npu.npu.is_available() else 0
        except Exception as e:  # a torch_npu / CANN mismatch raises at import
            return hetero.Availability(
                ok=False, reason=f"torch_npu failed to load: {type(e).__name__}: {e}", details=cls._unverified()
            )
        if count == 0:
            return hetero.Availability(
                ok=False,
                reason="no NPU visible (check the driver and ASCEND_RT_VISIBLE_DEVICES)",
                details=cls._unverified(),
            )
        index = torch_npu.npu.current_device()
        soc = torch_npu.npu.get_device_name(index)
        return hetero.Availability(
            ok=True,
            reason=f"torch_npu paths {support.NEVER_RUN}",
            device_name=soc,
            details={"soc": soc, "devices": count, "torch": torch.__version__, **cls._unverified()},
        )

    @classmethod
    def _unverified(cls) -> dict[str, Any]:
        """The marker `hetero explain ascend` shows: which ops are torch_npu mappings never run on an NPU."""
        return {
            "triton_ascend": support.triton_ascend_version() or "not installed",
            **{op: f"{support.target(op)}; {support.NEVER_RUN}" for op in support.MAPPED},
        }

    def supports(self, op: str, **static: Any) -> str | None:
        return support.reason(op, static, support.triton_ascend_version() is not None)

    # -- attention ------------------------------------------------------------------------
    def _fia(
        self,
        query,
        key,
        value,
        q_lens,
        kv_lens,
        *,
        scale,
        causal,
        window,
        return_lse,
        block_table=None,
        block_size=0,
        num_kv_heads,
        query_rope=None,
        key_rope=None,
    ):
        sp = convert.sparse_args(causal, window)
        out, lse = _npu().npu_fused_infer_attention_score(
            convert.tnd_query(query),
            key,
            value,
            query_rope=query_rope,
            key_rope=key_rope,
            atten_mask=convert.causal_mask(str(query.device)) if sp["mask"] else None,
            actual_seq_lengths=q_lens,
            actual_seq_lengths_kv=kv_lens,
            block_table=block_table,
            block_size=block_size,
            num_heads=query.shape[1],
            num_key_value_heads=num_kv_heads,
            scale=scale,
            input_layout="TND",
            sparse_mode=sp["sparse_mode"],
            pre_tokens=sp["pre_tokens"],
            next_tokens=sp["next_tokens"],
            softmax_lse_flag=return_lse,
        )
        return (out, convert.lse_from_npu(lse)) if return_lse else out

    def paged_attention(
        self,
        query,
        k_cache,
        v_cache,
        meta,
        *,
        scale,
        causal=True,
        window=(-1, -1),
        softcap=0.0,
        sinks=None,
        out=None,
        return_lse=False,
    ):
        """torch_npu.npu_fused_infer_attention_score, TND + block_table; never run on an NPU
        (conversions tested on CPU)."""
        q_lens, kv_lens = convert.paged_lengths(meta, num_tokens=query.shape[0], block_size=k_cache.shape[1])
        res = self._fia(
            query,
            convert.paged_kv_bsh(k_cache),
            convert.paged_kv_bsh(v_cache),
            q_lens,
            kv_lens,
            scale=scale,
            causal=causal,
            window=window,
            return_lse=return_lse,
            block_table=convert.safe_block_table(meta.block_table, k_cache.shape[0]),
            block_size=k_cache.shape[1],
            num_kv_heads=k_cache.shape[2],
        )
        if out is None:
            return res
        out.copy_(res[0] if return_lse else res)
        return (out, res[1]) if return_lse else out

    def varlen_attention(
        self,
        query,
        key,
        value,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        *,
        scale,
        causal=True,
        window=(-1, -1),
        softcap=0.0,
        return_lse=False,
    ):
        """torch_npu.npu_fused_infer_attention_score, dense TND; never run on an NPU (conversions tested on CPU)."""
        q_lens, kv_lens = convert.varlen_lengths(
            cu_seqlens_q, cu_seqlens_k, num_tokens=query.shape[0], num_keys=key.shape[0]
        )
        return self._fia(
            query,
            key.contiguous(),
            value.contiguous(),
            q_lens,
            kv_lens,
            scale=scale,
            causal=causal,
            window=window,
            return_lse=return_lse,
            num_kv_heads=key.shape[1],
        )

    def mla_attention(
        self, q_nope, q_pe, ckv_cache, kpe_cache, meta, *, scale, causal=True, return_lse=False, topk_indices=None
    ):
        """FIA's MLA form (query_rope/key_rope, D = 512); with ``topk_indices``, npu_sparse_flash_attention;
        never run on an NPU (conversions tested on CPU). FIA takes 1..16 query rows per sequence here (doc):
        longer chunks, and calls outside SFA's documented limits, go to the Triton kernel."""
        if topk_indices is not None:  # the always-on checks first: the SFA conversion indexes by them
            t = check_mla_inputs("mla_attention", q_nope, q_pe, ckv_cache, kpe_cache, _KERNEL_DTYPES)[0]
            check_meta_shapes("mla_attention", meta, t)
            check_topk_indices("mla_attention", topk_indices, t, q_nope.device)
            if support.sfa_reason(sparse.sfa_static(q_nope, q_pe, ckv_cache, return_lse)) is not None:
                return super().mla_attention(
                    q_nope,
                    q_pe,
                    ckv_cache,
                    kpe_cache,
                    meta,
                    scale=scale,
                    causal=causal,
                    return_lse=return_lse,
                    topk_indices=topk_indices,
                )
            return sparse.sparse_flash_mla(
                _npu(), q_nope, q_pe, ckv_cache, kpe_cache, meta, topk_indices, scale=scale, causal=causal
            )
        if meta.max_query_len > 16 or return_lse:
            return super().mla_attention(
                q_nope, q_pe, ckv_cache, kpe_cache, meta, scale=scale, causal=causal, return_lse=return_lse
            )
        q_lens, kv_lens = convert.paged_lengths(meta, num_tokens=q_nope.shape[0], block_size=ckv_cache.shape[1])
        ckv = convert.paged_kv_bsh(ckv_cache)
        return self._fia(
            q_nope,
            ckv,
            ckv,
            q_lens,
            kv_lens,
            scale=scale,
            causal=causal and meta.max_query_len > 1,
            window=(-1, -1),
            return_lse=False,
            block_table=convert.safe_block_table(meta.block_table, ckv_cache.shape[0]),
            block_size=ckv_cache.shape[1],
            num_kv_heads=1,
            query_rope=convert.tnd_query(q_pe),
            key_rope=convert.paged_kv_bsh(kpe_cache),
        )

    def indexer_topk(self, q, weights, index_cache, meta, *, topk, index_scale=None):
        """torch_npu.npu_lightning_indexer (TND query, PA_BSND key, sparse_mode 3); never run on an NPU
        (conversions tested on CPU). Calls outside its documented limits go to the Triton kernel."""
        t = check_indexer_inputs("indexer_topk", q, weights, index_cache, meta, topk, index_scale)[0]
        check_meta_shapes("indexer_topk", meta, t)
        if support.indexer_reason(sparse.indexer_static(q, index_cache, topk, index_scale)) is not None:
            return super().indexer_topk(q, weights, index_cache, meta, topk=topk, index_scale=index_scale)
        return sparse.lightning_indexer(_npu(), q, weights, index_cache, meta, topk)

    # -- gemm / moe -----------------------------------------------------------------------
    def grouped_gemm(self, a, b, group_ends, *, out_dtype=None):
        """torch_npu.npu_grouped_matmul with one 3-D weight (split_item 3, group_type 0, cumsum group_list
        ending at a's rows, <= 1024 groups); never run on an NPU (conversions tested on CPU)."""
        from hetero.kernels.gemm import check_operands  # not at import: the kernel modules load under the interpreter

        check_operands("grouped_gemm", a, b, FLOAT_DTYPES, b_ndim=3)
        check_tensor("grouped_gemm", "group_ends", group_ends, shape=(b.shape[0],), dtypes=(torch.int32, torch.int64))
        if a.shape[0] == 0 or b.shape[0] == 0:  # no call: all rows are past the last group
            return a.new_zeros(a.shape[0], b.shape[1], dtype=out_dtype or a.dtype)
        gl, last = quant.gmm_group_list(group_ends, a.shape[0])
        y = _npu().npu_grouped_matmul(
            [a.contiguous()], [convert.grouped_weights(b)], group_list=gl, split_item=3, group_type=0, group_list_type=0
        )[0]
        y = quant.zero_past(y, last)
        return y if out_dtype in (None, y.dtype) else y.to(out_dtype)

    def scaled_grouped_gemm(self, a, b, a_scale, b_scale, group_ends, *, a_zero_point=None, out_dtype=torch.bfloat16):
        """torch_npu.npu_grouped_matmul's int8 per-token form (per_token_scale x per-channel scale, one 3-D
        weight, cumsum group_list); never run on an NPU (conversions tested on CPU). Calls outside its
        documented limits (fp8, block scales, a zero point, float32 output) go to the Triton kernel."""
        forms = check_scaled_grouped("scaled_grouped_gemm", a, b, a_scale, b_scale, group_ends, a_zero_point, out_dtype)
        if quant.gmm_reason(quant.gmm_static(a, b, forms, a_zero_point, out_dtype)) is not None:
            return super().scaled_grouped_gemm(
                a, b, a_scale, b_scale, group_ends, a_zero_point=a_zero_point, out_dtype=out_dtype
            )
        return quant.grouped_matmul_w8a8(_npu(), a, b, a_scale, b_scale, group_ends, forms, out_dtype)

    def route(
        self,
        router_logits,
        *,
        top_k,
        scoring="softmax",
        renormalize=True,
        n_group=1,
        topk_group=1,
        correction_bias=None,
        routed_scaling_factor=1.0,
    ):
        """torch_npu.npu_moe_gating_top_k; never run on an NPU (conversions tested on CPU)."""
        args = convert.gating_args(
            top_k, scoring, n_group, topk_group, correction_bias is not None, routed_scaling_factor
        )
        bias = None if correction_bias is None else correction_bias.to(router_logits.dtype)
        weights, ids, _ = _npu().npu_moe_gating_top_k(router_logits, bias=bias, **args)
        return weights.float(), ids.to(torch.int32)

    def moe_permute(self, x, ids, num_experts):
        """torch_npu.npu_moe_init_routing_v2 (dropless, cumsum counts); never run on an NPU
        (conversions tested on CPU)."""
        x_sorted, row_idx, ends, _ = _npu().npu_moe_init_routing_v2(
            x,
            convert.safe_expert_ids(ids, num_experts),
            active_num=ids.numel(),
            expert_num=num_experts,
            drop_pad_mode=0,
            expert_tokens_num_type=0,
            expert_tokens_num_flag=True,
            row_idx_type=0,
        )
        return x_sorted, ends.to(torch.int32), convert.perm_from_row_idx(row_idx)

    def moe_unpermute(self, y_sorted, perm, weights):
        """torch_npu.npu_moe_token_unpermute; never run on an NPU (conversions tested on CPU)."""
        y = _npu().npu_moe_token_unpermute(y_sorted.float(), convert.unpermute_indices(perm), weights.float())
        return y.to(y_sorted.dtype)

    # -- expert parallelism ---------------------------------------------------------------
    @staticmethod
    def _hccl_group(x, comm) -> Any | None:
        """The process group when this call may use torch_npu (x on an NPU, comm over an HCCL group), else None.
        Checks the device first so torch_npu is never imported for CPU tensors."""
        if getattr(x, "device", None) is None or x.device.type != "npu":
            return None
        if importlib.util.find_spec("torch_npu") is None:
            return None
        from hetero.distributed import TorchCommunicator

        if not isinstance(comm, TorchCommunicator):
            return None
        import torch.distributed as dist

        group = comm.group if comm.group is not None else dist.group.WORLD
        try:
            return group if dist.get_backend(group) == "hccl" else None
        except Exception:
            return None

    def ep_dispatch(self, x, ids, weights, *, num_experts, comm):
        """torch_npu.npu_moe_distribute_dispatch where its documented limits hold (checked on all ranks with one
        small all_reduce), else the portable hetero._ep path; never run on an NPU (conversions tested on CPU)."""
        from hetero import ep as portable

        group = self._hccl_group(x, comm)
        if group is None:
            return portable.ep_dispatch(x, ids, weights, num_experts=num_experts, comm=comm)
        stats = comm.all_reduce(ep.rank_stats(x.shape[0], ep.duplicate_ids(ids), x.device), "max").tolist()
        max_bs, min_bs, dup = int(stats[0]), -int(stats[1]), bool(stats[2])
        torch_npu = _npu()
        product = ep.product_of(torch_npu.npu.get_device_name(x.device.index))
        why = ep.dispatch_limit_reason(
            product=product,
            world=comm.world_size,
            num_experts=num_experts,
            top_k=ids.shape[1],
            hidden=x.shape[1],
            min_bs=min_bs,
            max_bs=max_bs,
            dtype=x.dtype,
            duplicates=dup,
            buffsize_mb=ep.hccl_buffsize_mb(),
        )
        if why is not None:  # the same on every rank: all inputs to it are rank-uniform
            return portable.ep_dispatch(x, ids, weights, num_experts=num_experts, comm=comm)
        import torch.distributed as dist

        name = group._get_backend(torch.device("npu")).get_hccl_comm_name(dist.get_rank())
        args = ep.dispatch_args(
            comm_name=name, world=comm.world_size, rank=comm.rank, num_experts=num_experts, max_bs=max_bs
        )
        ids32 = convert.safe_expert_ids(ids, num_experts)
        outs = torch_npu.npu_moe_distribute_dispatch(x, ids32, quant_mode=0, **args)
        return ep.from_dispatch_outputs(
            tuple(outs),
            ids=ids32,
            weights=weights,
            num_tokens=x.shape[0],
            num_experts=num_experts,
            comm=comm,
            args=args,
        )

    def ep_combine(self, y_local, dispatch):
        """torch_npu.npu_moe_distribute_combine for a dispatch made by npu_moe_distribute_dispatch, else the
        portable hetero._ep path; never run on an NPU (conversions tested on CPU)."""
        if isinstance(dispatch, ep.NpuEPDispatch):
            return _npu().npu_moe_distribute_combine(**ep.combine_args(y_local, dispatch)).to(y_local.dtype)
        from hetero import ep as portable

        return portable.ep_combine(y_local, dispatch)

    # -- layers ---------------------------------------------------------------------------
    def rms_norm(self, x, weight, eps, *, residual=None, weight_offset=0.0, gate=None, gate_act="silu"):
        """torch_npu.npu_rms_norm / npu_add_rms_norm; never run on an NPU (conversions tested on CPU).
        They have no weight offset and no gate: those calls take the portable Triton kernel, which needs
        triton-ascend (``supports`` declines them without it)."""
        if weight_offset or gate is not None or gate_act != "silu":
            return super().rms_norm(
                x, weight, eps, residual=residual, weight_offset=weight_offset, gate=gate, gate_act=gate_act
            )
        if residual is None:
            return _npu().npu_rms_norm(x, weight.to(x.dtype), epsilon=eps)[0]
        y, _, h = _npu().npu_add_rms_norm(x, residual, weight.to(x.dtype), eps)
        return y, h

    def rotary_embedding(self, positions, q, k, cos_sin_cache, *, is_neox=True):
        """torch_npu.npu_rotary_mul (neox half-rotation), rotary dims only; never run on an NPU
        (conversions tested on CPU)."""
        r1, r2 = convert.rotary_factors(positions, cos_sin_cache.to(q.dtype))
        rot = cos_sin_cache.shape[-1]

        def apply(x):
            head = _npu().npu_rotary_mul(x[..., :rot].unsqueeze(1).contiguous(), r1, r2).squeeze(1)
            return torch.cat([head, x[..., rot:]], dim=-1) if rot < x.shape[-1] else head

        return apply(q), apply(k)

    def layer_norm(self, x, weight, bias, eps):
        """torch.nn.functional.layer_norm in float32 (an aten op torch_npu implements; it deprecates
        npu_layer_norm_eval in its favour), rounded once to x's dtype; never run on an NPU (checked on CPU)."""
        hidden = check_layer_norm("layer_norm", x, weight, bias, eps)
        y = torch.nn.functional.layer_norm(
            x.float(), (hidden,), weight.float(), None if bias is None else bias.float(), eps
        )
        return y.to(x.dtype)


def sparse_notes() -> dict[str, str]:
    """What the DSA mappings assume and nothing here could check (shown by ``op_notes`` / explain)."""
    return {
        "indexer_topk": (
            f"mapped to torch_npu.npu_lightning_indexer (TND + PA_BSND, sparse_mode 3, float32 weights) "
            f"where its documented limits allow (64 heads, D 128, topk <= 2048, plain cache), else the "
            f"Triton kernel; assumed: scores accumulated in float32 (the doc's test reference does), indices "
            f"are positions within the sequence, and ties at the k-th score keep the smaller position "
            f"(the doc states no tie rule: the spec's set may differ there); {support.NEVER_RUN}"
        ),
        "mla_attention": (
            f"mapped to torch_npu.npu_fused_infer_attention_score (dense, <= 16 query rows) and "
            f"torch_npu.npu_sparse_flash_attention (topk_indices; MLA-absorb, token-wise) where their "
            f"documented limits allow, else the Triton kernel; assumed: SFA reads position j of a "
            f"sequence through its block table and skips -1 entries; {support.NEVER_RUN}"
        ),
    }


@hetero.hookimpl
def hetero_backends() -> list[type[hetero.Backend]]:
    return [AscendBackend]
