"""What the ascend backend runs natively, per op and static configuration (the body of ``supports``).

Limits are the documented ones; doc = Ascend/op-plugin docs/context/torch_npu-npu_fused_infer_attention_score.md
(FIA) unless said. A number that could not be confirmed says "unverified" in its reason.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
from typing import Any, Mapping

from hetero.kernels.limits import dtype_name, kernel_reason
from hetero_ascend import _int4, _token_slots, quant

__all__ = [
    "MAPPED",
    "NEVER_RUN",
    "DECLINED",
    "reason",
    "target",
    "indexer_reason",
    "sfa_reason",
    "triton_ascend_version",
]

#: op -> the torch_npu operator it is mapped to (a name starting "torch." is a torch op torch_npu dispatches).
MAPPED = {
    "paged_attention": "npu_fused_infer_attention_score",
    "varlen_attention": "npu_fused_infer_attention_score",
    "mla_attention": (
        "npu_fused_infer_attention_score (query_rope/key_rope); with topk_indices "
        "npu_sparse_flash_attention (MLA-absorb)"
    ),
    "indexer_topk": "npu_lightning_indexer",
    "layer_norm": "torch.nn.functional.layer_norm in float32 (torch_npu deprecates npu_layer_norm_eval for it)",
    "grouped_gemm": "npu_grouped_matmul",
    "route": "npu_moe_gating_top_k",
    "moe_permute": "npu_moe_init_routing_v2",
    "moe_unpermute": "npu_moe_token_unpermute",
    "rms_norm": "npu_rms_norm / npu_add_rms_norm",
    "rotary_embedding": "npu_rotary_mul",
    "ep_dispatch": "npu_moe_distribute_dispatch",
    "ep_combine": "npu_moe_distribute_combine",
    "scaled_grouped_gemm": quant.GMM,
}
NEVER_RUN = "never run on an NPU (conversions tested on CPU)"

#: Ops ascend declines whatever is installed, with the reason: the reference runs them.
DECLINED = {
    op: (
        f"torch_npu documents no {what} operator (vllm-ascend runs its own triton-ascend ports of fla's "
        f"kernels), and hetero's portable Triton {op} kernel is unverified on triton-ascend: never run on an NPU"
    )
    for op, what in (("causal_conv1d", "causal conv1d"), ("gated_delta_rule", "gated delta rule"))
}
#: spec 1.7's hyper-connection ops (HY4, DeepSeek-V4)
DECLINED.update(
    {
        op: (
            "torch_npu documents no hyper-connection (mHC) operator, and hetero's portable Triton "
            f"{op} kernel is unverified on triton-ascend: never run on an NPU"
        )
        for op in ("hc_pre", "hc_post", "hc_head")
    }
)
#: spec 1.8 (DeepSeek-V4): FIA and SFA have neither sinks nor a second, compressed cache
DECLINED["compressed_attention"] = (
    "torch_npu documents no attention over a sliding window plus compressed entries with sinks (FIA and "
    "SFA have neither; CANN's DeepSeek-V4 fusions are PyPTO samples, not torch_npu operators), and hetero's "
    "portable Triton compressed_attention kernel is unverified on triton-ascend: never run on an NPU"
)
DECLINED["kv_compress"] = (
    "torch_npu documents no KV-compressor operator (CANN's DeepSeek-V4 compressor is a PyPTO sample in "
    "cann-recipes-infer, not a torch_npu operator), and hetero's portable Triton kv_compress kernel is "
    "unverified on triton-ascend: never run on an NPU"
)
DECLINED["rejection_sample"] = "torch_npu documents no rejection-sampling operator; never run on an NPU (spec 1.10)"

HALF = ("float16", "bfloat16")  # FIA query: float16, bfloat16 (doc, A2/A3)
HALF_FP32 = ("float16", "bfloat16", "float32")  # npu_rms_norm, npu_moe_gating_top_k, npu_grouped_matmul (A2/A3)
PAGED_BLOCKS = (128, 256, 384, 512)  # doc: page attention (Q_S > 1) block_size min 128, max 512, multiple of 128
MLA_BLOCKS = (16, 128)  # doc: MLA (D = 512) with page attention, block_size 16 or 128
MLA_HEADS = (32, 64, 128)  # doc: MLA query n 32/64/128
MAX_GATING_TOPK = 32  # ptaoplist_002365 (Pytorch 7.0.0): k in [1, 32] on A2/A3
MAX_GATING_EXPERTS = 2048  # aclnnMoeGatingTopK (CANN 8.5): expert count <= 2048 (7.0.0 said only 256)

# DSA: LI = npu_lightning_indexer (CANN ops-transformer lightning_indexer README, MindSpore lightning_indexer doc),
# SFA = npu_sparse_flash_attention (op-plugin torch_npu-npu_sparse_flash_attention.md).
LI_HEADS = 64  # README: Q_N <= 64 on A2/A3; MindSpore's doc: "only 64 when layout_query is TND" -- the stricter one
LI_HEAD_DIM = 128  # both docs: D only 128
LI_MAX_TOPK = 2048  # sparse_count 1..2048 (the README adds 3072..8192 in steps of 1024: newer only, not used)
SFA_HEADS = (1, 2, 4, 8, 16, 32, 64, 128)  # doc: N1 1/2/4/8/16/32/64/128, KV_N 1
SFA_LATENT, SFA_ROPE = 512, 64  # doc: query/key D 512, query_rope/key_rope D 64
PA_BLOCK_MULTIPLE, PA_MAX_BLOCK = 16, 1024  # both: block_size a multiple of 16, at most 1024

# npu_moe_distribute_dispatch / _combine (doc = Ascend/op-plugin docs/context/torch_npu-npu_moe_distribute_dispatch.md,
# hiascend Pytorch 7.0.0 ptaoplist_002364). "A2" = Atlas A2 (Ascend910B*), "A3" = Atlas A3 (Ascend910_93*);
# the SoC-name -> product mapping is unverified. None = product unknown: the intersection of both.
EP_DTYPES = ("float16", "bfloat16")  # doc: x bfloat16, float16
EP_WORLD = {"A2": (16, 32, 64), "A3": (8, 16, 32, 64, 128, 144, 256, 288)}  # doc: ep_world_size
EP_MAX_BS = {"A2": 256, "A3": 512}  # doc: 0 < BS <= 256 (A2), <= 512 (A3)
EP_MAX_TOPK = 8  # doc: 0 < K <= 8 (A3 and the 7.0.0 page; the newer doc allows 16 on A2 -- not used)
EP_MAX_EXPERTS = 512  # doc: moe_expert_num in [1, 512], divisible by ep_world_size
EP_A2_MAX_LOCAL_EXPERTS = 24  # doc: A2 moe_expert_num / ep_world_size <= 24
EP_A2_MAX_HIDDEN = 7168  # doc: A2 H in (0, 7168], a multiple of 32
EP_A2_HIDDEN_MULTIPLE = 32
EP_A3_HIDDEN = 7168  # doc: A3 H only 7168
HCCL_BUFFSIZE_DEFAULT_MB = 200  # doc: HCCL_BUFFSIZE default 200 MB


def triton_ascend_version() -> str | None:
    """triton-ascend's version when installed (never imported here), else None."""
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        return md.version("triton-ascend")
    except md.PackageNotFoundError:
        return None


def _attention_reason(op: str, s: Mapping[str, Any]) -> str | None:
    hd, hdv = s.get("head_dim"), s.get("head_dim_v")
    if hd is not None and (int(hd) % 16 or int(hd) > 512):
        return f"FIA takes head dims that are multiples of 16 up to 512 (float16/bfloat16), not {int(hd)}"
    if float(s.get("softcap", 0.0) or 0.0) > 0:
        return "FIA has no logit softcap"
    if s.get("sinks") is not None and s.get("sinks") is not False:
        return "FIA has no attention sinks"
    window = tuple(s.get("window", (-1, -1)) or (-1, -1))
    if window != (-1, -1):
        return (
            "FIA with the TND layout takes only sparse_mode 0 or 3 (no band window), and ignores "
            "pre_tokens/next_tokens when Q_S = 1 (doc)"
        )
    hq, hkv = s.get("num_heads"), s.get("num_kv_heads")
    if hq is not None and hkv is not None and int(hq) // max(int(hkv), 1) > 64:
        return f"FIA takes num_heads / num_key_value_heads <= 64, not {int(hq)}/{int(hkv)}"
    if op == "paged_attention":
        bs = s.get("block_size")
        if bs is not None and int(bs) not in PAGED_BLOCKS:
            return f"FIA page attention takes block_size 128..512 in multiples of 128 (doc, Q_S > 1), not {int(bs)}"
        if hd is not None and hdv is not None and int(hd) != int(hdv):
            return "FIA page attention keeps key and value head dims equal"
    return None


def _dims_reason(form: str, s: Mapping[str, Any], wants: tuple[tuple[tuple[str, ...], int], ...]) -> str | None:
    for keys, want in wants:
        for key in keys:
            if s.get(key) is not None and int(s[key]) != want:
                return f"{form} takes {key} {want} (doc), not {int(s[key])}"
    return None


def _mla_reason(s: Mapping[str, Any]) -> str | None:
    if s.get("sinks") is not None and s.get("sinks") is not False:  # spec 1.7 (HY4)
        return "FIA's MLA form and npu_sparse_flash_attention have no attention sinks (no such argument in their docs)"
    if s.get("topk_indices") is not None and s.get("topk_indices") is not False:
        return sfa_reason(s)
    dtype = dtype_name(s.get("dtype"))
    if dtype is not None and dtype not in HALF:
        return f"FIA takes float16 or bfloat16 queries, not {dtype}"
    if s.get("return_lse"):
        return "FIA's MLA form (D = 512) does not output softmax_lse (doc)"
    hq, bs = s.get("num_heads"), s.get("block_size")
    if hq is not None and int(hq) not in MLA_HEADS:
        return f"FIA's MLA form takes 32, 64 or 128 query heads (doc), not {int(hq)}"
    if bs is not None and int(bs) not in MLA_BLOCKS:
        return f"FIA's MLA form takes block_size 16 or 128 (doc), not {int(bs)}"
    return _mla_dims_reason("FIA's MLA form", s)


def _mla_dims_reason(form: str, s: Mapping[str, Any]) -> str | None:
    """Latent 512 and rope 64; ``head_dim`` is either the latent (512) or the whole q.k width (576)."""
    hd = s.get("head_dim")
    if hd is not None and int(hd) not in (512, 576):
        return f"{form} takes head_dim 512 (+ rope 64) (doc), not {int(hd)}"
    return _dims_reason(
        form, s, ((("latent_dim", "kv_lora_rank", "head_dim_v"), 512), (("rope_dim", "qk_rope_head_dim"), 64))
    )


def _paged_block_reason(op: str, bs: Any) -> str | None:
    if bs is not None and (int(bs) % PA_BLOCK_MULTIPLE or not 0 < int(bs) <= PA_MAX_BLOCK):
        return f"{op} takes block_size a multiple of {PA_BLOCK_MULTIPLE} up to {PA_MAX_BLOCK} (doc), not {int(bs)}"
    return None


def sfa_reason(s: Mapping[str, Any]) -> str | None:
    """None if npu_sparse_flash_attention serves a sparse mla_attention call with ``s``, else why not."""
    dtype = dtype_name(s.get("dtype"))
    if dtype is not None and dtype not in HALF:
        return f"npu_sparse_flash_attention takes float16 or bfloat16, not {dtype}"
    if s.get("return_lse"):
        return (
            "npu_sparse_flash_attention returns softmax_max/softmax_sum only in training without PA_BSND "
            "(doc): no lse for a paged cache"
        )
    hq = s.get("num_heads")
    if hq is not None and int(hq) not in SFA_HEADS:
        return f"npu_sparse_flash_attention takes 1, 2, 4, ..., 128 query heads (doc), not {int(hq)}"
    return _paged_block_reason("npu_sparse_flash_attention", s.get("block_size")) or _mla_dims_reason(
        "npu_sparse_flash_attention", s
    )


def indexer_reason(s: Mapping[str, Any]) -> str | None:
    """None if npu_lightning_indexer serves an indexer_topk call with ``s``, else why not."""
    if int(s.get("compress_ratio") or 1) != 1:
        return "npu_lightning_indexer documents no compressed key cache (compress_ratio, spec 1.8, DeepSeek-V4)"
    if s.get("index_scale") is not None and s.get("index_scale") is not False:
        return (
            "hetero's fp8 index cache (float8_e4m3fn, a float32 scale per 128 channels) has no torch_npu "
            "form: npu_quant_lightning_indexer takes int8 keys with float16 per-token scales on A2/A3 (doc)"
        )
    dtype = dtype_name(s.get("dtype"))
    if dtype is not None and dtype not in HALF:
        return f"npu_lightning_indexer takes float16 or bfloat16 queries and keys, not {dtype}"
    hi, k = s.get("num_heads"), s.get("topk")
    if hi is not None and int(hi) != LI_HEADS:
        return (
            f"npu_lightning_indexer with layout_query TND takes {LI_HEADS} query heads (MindSpore's doc; "
            f"the CANN README says <= 64 on A2/A3: unverified), not {int(hi)}"
        )
    if k is not None and not 1 <= int(k) <= LI_MAX_TOPK:
        return f"npu_lightning_indexer takes sparse_count 1..{LI_MAX_TOPK} (doc), not topk {int(k)}"
    return _dims_reason("npu_lightning_indexer", s, ((("head_dim",), LI_HEAD_DIM),)) or _paged_block_reason(
        "npu_lightning_indexer", s.get("block_size")
    )


def target(op: str) -> str:
    """The full name of what ``op`` is mapped to (``torch_npu.`` prefixed unless it is a torch op)."""
    fn = MAPPED[op]
    return fn if fn.startswith("torch.") else f"torch_npu.{fn}"


def _mapped_reason(op: str, s: Mapping[str, Any]) -> str | None:
    dtype = dtype_name(s.get("dtype"))
    if op == "mla_attention":
        return _mla_reason(s)
    if op in ("paged_attention", "varlen_attention"):
        if dtype is not None and dtype not in HALF:
            return f"FIA takes float16 or bfloat16 queries, not {dtype}"
        return _attention_reason(op, s)
    if op == "indexer_topk":
        return indexer_reason(s)
    if dtype is not None and dtype not in HALF_FP32 and op != "moe_permute" and op != "moe_unpermute":
        return f"{target(op).split(' in ')[0]} takes float16, bfloat16 or float32, not {dtype}"
    if op == "grouped_gemm" and s.get("num_experts") is not None and int(s["num_experts"]) > quant.GMM_MAX_GROUPS:
        return f"npu_grouped_matmul takes at most {quant.GMM_MAX_GROUPS} groups (doc), not {int(s['num_experts'])}"
    if op == "route":
        k, e = s.get("top_k"), s.get("num_experts")
        if k is not None and not 1 <= int(k) <= MAX_GATING_TOPK:
            return f"npu_moe_gating_top_k takes top_k 1..{MAX_GATING_TOPK}, not {int(k)}"
        if e is not None and int(e) > MAX_GATING_EXPERTS:
            return f"npu_moe_gating_top_k takes at most {MAX_GATING_EXPERTS} experts, not {int(e)}"
        if s.get("renormalize") is False:
            return "npu_moe_gating_top_k always renormalizes the top-k weights (y / (sum y + eps))"
        if s.get("fixed_ids") or s.get("scoring") == "sqrtsoftplus":
            return "npu_moe_gating_top_k scores by softmax or sigmoid and selects: no sqrtsoftplus or fixed_ids (1.8)"
        if s.get("scoring", "softmax") == "softmax":
            return "npu_moe_gating_top_k's softmax scoring (norm_type 0) is in newer CANN docs only: unverified"
    if op == "rotary_embedding" and s.get("is_neox") is False:
        return "npu_rotary_mul's interleaved (GPT-J) mode is unverified"
    return None


def _rms_norm_options(s: Mapping[str, Any]) -> bool:
    """Whether a static rms_norm configuration asks for an option torch_npu's norms lack (spec 1.2)."""
    gate = s.get("gate")
    return float(s.get("weight_offset", 0.0) or 0.0) != 0.0 or (gate is not None and gate is not False)


def reason(op: str, static: Mapping[str, Any], triton_ok: bool) -> str | None:
    """None if ``op`` runs natively with ``static``, else why not."""
    if op in DECLINED:
        return _token_slots.reason(op, static) or DECLINED[op]
    if _int4.packed_int4(op, static):
        return _int4.INT4_REASON
    if op in ("ep_dispatch", "ep_combine"):
        # always accepted: the method itself checks the npu_moe_distribute_* limits at run time
        # (hetero_ascend.ep.dispatch_limit_reason) and otherwise runs the portable hetero._ep path
        return None
    if op in quant.QUANT_OPS or (op == "fused_moe" and quant.quantized_moe(static)):
        return quant.reason(op, static, triton_ok)
    if op == "rms_norm" and _rms_norm_options(static):
        if not triton_ok:
            return (
                "npu_rms_norm / npu_add_rms_norm have no weight_offset or gate (the portable Triton kernel "
                "has them, but triton-ascend is not installed)"
            )
        return kernel_reason(op, static)
    if op in MAPPED:
        return _mapped_reason(op, static)
    if not triton_ok:
        return "no torch_npu fused op and triton-ascend is not installed"
    return kernel_reason(op, static)
