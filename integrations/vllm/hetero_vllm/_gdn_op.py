"""``hetero::gdn_attention_core``: a Gated DeltaNet layer's conv1d and delta rule on hetero, over vLLM's state cache.

The op takes what vLLM's own CPU core op takes (the projected ``mixed_qkv``, ``b``
and ``a``, the output buffer and the layer's name) and finds the rest where vLLM
keeps it: the layer in the forward context's ``no_compile_layers`` and its
``GDNAttentionMetadata`` under ``attn_metadata[layer.prefix]`` (decodes first, then
prefills; built by vLLM's GDN backend as for its own kernels). The state cache is
the layer's ``kv_cache = (conv_state, ssm_state)``:

- conv state: vLLM's SD layout ``[S, W-1, C]`` is hetero's; the DS layout
  ``[S, C, W-1]`` (``VLLM_SSM_CONV_STATE_LAYOUT=DS``) is passed as its transposed view;
- SSM state: vLLM declares ``[S, HV, V, K]``; hetero's ``[S, HV, K, V]`` is its
  transposed view, so the cache means what vLLM's declared shape says.

Both views are strided; hetero writes through them, so vLLM's own state handling
(prefix-cache block copies, state slot assignment) is untouched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hetero_vllm import _backend, report

__all__ = ["gdn_attention_core", "conv_weight"]


def conv_weight(conv1d: torch.nn.Module) -> torch.Tensor:
    """The depthwise conv weight ``[C, W]`` of vLLM's ``conv1d`` holder.

    vLLM-CPU packs a bf16 ``[C, 1, W]`` weight for its own kernel at load time and
    keeps the plain copy as ``_cpu_unpacked_conv_weight``; a holder whose quant
    method did not pack it keeps ``weight`` ``[C, 1, W]``, which is squeezed.
    """
    weight = getattr(conv1d, "_cpu_unpacked_conv_weight", None)
    if weight is None:
        weight = conv1d.weight
        if weight.ndim == 3 and weight.shape[1] == 1:
            weight = weight[:, 0]
    if weight.ndim != 2:
        raise RuntimeError(
            f"hetero-vllm gdn_attention_core: expected the conv1d weight as [C, 1, W] or [C, W], "
            f"got shape {list(weight.shape)} (packed by another kernel, with no unpacked copy)"
        )
    return weight


def _conv_state(layer, width: int) -> torch.Tensor:
    """The layer's conv state as hetero's ``[S, W-1, C]`` (a view of vLLM's cache)."""
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    cache = layer.kv_cache[0]
    state = cache.transpose(1, 2) if is_conv_state_dim_first() else cache
    if state.shape[1] != width - 1:
        raise RuntimeError(
            f"hetero-vllm gdn_attention_core: {layer.prefix}'s conv state keeps {state.shape[1]} inputs per slot, "
            f"expected W-1 = {width - 1} (a wider buffer is speculative decoding's, which hetero does not route)"
        )
    return state


def _metadata(layer_name: str):
    """(layer, its GDNAttentionMetadata or None on a run without metadata, e.g. vLLM's profiling run)."""
    from vllm.forward_context import get_forward_context

    context = get_forward_context()
    layer = context.no_compile_layers[layer_name]
    metadata = context.attn_metadata
    if metadata is None:
        return layer, None
    if not isinstance(metadata, dict):
        raise RuntimeError(
            f"hetero-vllm gdn_attention_core: expected the forward context's attn_metadata as a dict by "
            f"layer name, got {type(metadata).__name__} (micro-batching is not routed)"
        )
    return layer, metadata[layer.prefix]


def _core(layer, meta, mixed_qkv, b, a, core_attn_out, site: str) -> None:
    if meta.num_spec_decodes or meta.spec_sequence_masks is not None:
        raise RuntimeError(
            f"hetero-vllm gdn_attention_core: {layer.prefix} got a speculative-decoding batch "
            f"({meta.num_spec_decodes} spec decodes); hetero routes GDN layers only without speculative decoding"
        )
    seqs = meta.num_decodes + meta.num_prefills
    tokens = meta.num_decode_tokens + meta.num_prefill_tokens
    if tokens == 0:
        return
    query_start_loc = meta.non_spec_query_start_loc[: seqs + 1]
    slots = meta.non_spec_state_indices_tensor[:seqs]
    if meta.has_initial_state is None:  # a batch of decodes only: every sequence continues its state
        initial = torch.ones(seqs, dtype=torch.bool, device=query_start_loc.device)
    else:
        initial = meta.has_initial_state[:seqs]

    ops = _backend.ops()
    weight = conv_weight(layer.conv1d)
    conv_state = _conv_state(layer, weight.shape[1])
    # SiLU: gdn.unsupported() keeps any other conv activation on vLLM's path
    x = ops.causal_conv1d(
        mixed_qkv[:tokens], weight, layer.conv1d.bias, conv_state, query_start_loc, slots, initial, activation="silu"
    )
    report.record(site, "causal_conv1d")

    q, k, v = layer.rearrange_mixed_qkv(x)  # vLLM's own q/k/v split, [1, T, heads, dim] each
    g = -torch.exp(layer.A_log.float()) * F.softplus(a[:tokens].float() + layer.dt_bias.float())
    beta = torch.sigmoid(b[:tokens].float())
    ssm_state = layer.kv_cache[1].transpose(-1, -2)  # vLLM's [S, HV, V, K] as hetero's [S, HV, K, V]
    out = ops.gated_delta_rule(
        q[0],
        k[0],
        v[0],
        g,
        beta,
        ssm_state,
        query_start_loc,
        slots,
        initial,
        scale=layer.head_k_dim**-0.5,
        use_qk_l2norm=True,
    )
    report.record(site, "gated_delta_rule")
    core_attn_out[:tokens] = out


@torch.library.custom_op("hetero::gdn_attention_core", mutates_args=("core_attn_out",))
def gdn_attention_core(
    mixed_qkv: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    core_attn_out: torch.Tensor,
    layer_name: str,
    site: str,
) -> None:
    """hetero ``causal_conv1d`` then ``gated_delta_rule`` for the GDN layer ``layer_name`` into ``core_attn_out``.

    mixed_qkv [T, 2*K*H + V*HV] (q, k, v heads, before the conv), b and a [T, HV]
    (the beta and decay projections), core_attn_out [T, HV, V]. The gates are
    Qwen3-Next's, in float32: ``g = -exp(A_log) * softplus(a + dt_bias)`` and
    ``beta = sigmoid(b)``; the scale is ``K**-0.5`` with q and k l2-normalized.
    Rows past the batch's tokens (padding) are left as they are.
    """
    layer, meta = _metadata(layer_name)
    if meta is None:
        return
    _core(layer, meta, mixed_qkv, b, a, core_attn_out, site)


@gdn_attention_core.register_fake
def _(mixed_qkv, b, a, core_attn_out, layer_name, site):
    return None
