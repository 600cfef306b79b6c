"""vLLM's parallel linear layers and LM head on hetero ``gemm``, with the weights exactly as loaded.

vLLM's linear layers are ``PluggableLayer``s (not CustomOps): a replacement
registered under the class name (``_oot.register_oot``) is built in its place.
Each replacement here subclasses the vLLM class, lets it build as usual, and
then, unless ``-<ClassName>`` or ``-gemm`` is in ``compilation_config.custom_ops``,
swaps the layer's quant method when it is vLLM's plain ``UnquantizedLinearMethod``
(``UnquantizedEmbeddingMethod`` for ``ParallelLMHead``) for hetero's subclass of it:

- ``process_weights_after_loading`` keeps a 2-D weight ``[N, K]`` as loaded:
  vLLM-CPU would pack it for sgl/oneDNN and drop the plain copy, hetero's
  ``gemm`` takes the nn.Linear layout (a backend may cache its own packed copy);
- ``apply`` is one ``torch.ops.hetero.gemm`` (an opaque node under compilation).

A weight that is not 2-D is no GEMM: the ``[dim, 1, width]`` causal-conv weight
that Gated DeltaNet and Mamba keep in a ``ColumnParallelLinear``. vLLM processes
it as it would without hetero (on an AVX512-BF16 or Arm-bf16 CPU it packs a bf16
width-4 one in place for its conv kernel and keeps the plain ``[dim, width]``
copy as ``_cpu_unpacked_conv_weight``), so vLLM's own GDN kernel keeps working;
a hetero GDN route reads ``_cpu_unpacked_conv_weight`` when present, else
``weight.squeeze(1)``. That instance is reported as not routed.

Not routed here: quantized layers (their quant method keeps its kernel, or is
hetero's through a quant config), subclasses defined elsewhere (GateLinear,
DeepSeekV2FusedQkvAProjLinear, ...: PluggableLayer swaps by exact class name)
and ``VocabParallelEmbedding``'s lookup, which is no GEMM; the census lists them.
"""

from __future__ import annotations

import functools

import torch

from hetero_vllm import _backend, report
from hetero_vllm._oot import register_oot
from hetero_vllm.torch_ops import _fresh

__all__ = ["LINEAR_CLASSES", "OPT_OUT", "gemm", "register"]

#: The vLLM linear classes (``vllm.model_executor.layers.linear``) replaced by name.
LINEAR_CLASSES = (
    "ReplicatedLinear",
    "ColumnParallelLinear",
    "MergedColumnParallelLinear",
    "QKVParallelLinear",
    "RowParallelLinear",
)
#: ``-gemm`` in ``compilation_config.custom_ops`` turns every linear route off (``-<ClassName>`` one class).
OPT_OUT = "gemm"


def _gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, site: str) -> torch.Tensor:
    report.record(site, "gemm")
    return _backend.ops().gemm(x, weight, bias=bias)


@torch.library.custom_op("hetero::gemm", mutates_args=())
def gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, site: str) -> torch.Tensor:
    """hetero ``gemm(x, weight, bias=bias)``: x [M, K], weight [N, K], bias [N] or None -> [M, N] of x's dtype."""
    return _fresh(_gemm(x, weight, bias, site), x, weight)


@gemm.register_fake
def _(x, weight, bias, site):
    return x.new_empty((x.shape[0], weight.shape[0]))


def _hetero_gemm(site: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.T + bias`` over x's last dim: the opaque ``hetero.gemm`` in a graph being traced; in eager mode
    the same body without the op dispatcher, which costs ~10 us a call (~9% of a 1x2048x1024 bf16 GEMM here)."""
    x2d = x.reshape(-1, x.shape[-1])
    if torch.compiler.is_compiling():
        out = torch.ops.hetero.gemm(x2d, weight, bias, site)
    else:
        out = _gemm(x2d, weight, bias, site)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def _opted_out(vllm_class: str) -> bool:
    """Whether the engine's ``custom_ops`` turns this class's route off; notes the choice where vLLM logs it."""
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    if config is None:
        return False
    _backend.remember_config(config)
    compilation = config.compilation_config
    off = f"-{vllm_class}" in compilation.custom_ops or f"-{OPT_OUT}" in compilation.custom_ops
    # listed there, '-gemm'/'-<Class>' count as ops of this model: vLLM does not warn that they have no effect
    (compilation.disabled_custom_ops if off else compilation.enabled_custom_ops).update([vllm_class, OPT_OUT])
    return off


@functools.cache
def _methods() -> tuple[type, type]:
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod, register_weight_loader_v2_supported_method
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    # vLLM picks a layer's weight loader by its method's class name: keep this one on the v2 loader too
    @register_weight_loader_v2_supported_method
    class HeteroUnquantizedLinearMethod(UnquantizedLinearMethod):
        """vLLM's unquantized linear method on hetero ``gemm``: a 2-D weight stays as loaded (nn.Linear layout)."""

        def __init__(self, site: str, vllm_class: str) -> None:
            super().__init__()
            self.hetero_site: str | None = site
            self.vllm_class = vllm_class

        def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
            ndim = layer.weight.ndim
            if ndim == 2 or layer.weight.is_meta:
                return  # kept as loaded; a missing (meta) layer is never called
            super().process_weights_after_loading(layer)  # may pack the conv weight in place
            report.withdraw(self.hetero_site)
            self.hetero_site = layer.hetero_site = None
            report.not_routed(
                f"{self.vllm_class}[{ndim}-D weight]",
                "not a GEMM (a causal-conv weight holder): left to vLLM's weight processing",
            )

        def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
            if self.hetero_site is None:
                return super().apply(layer, x, bias)
            return _hetero_gemm(self.hetero_site, x, layer.weight, bias)

    class HeteroUnquantizedEmbeddingMethod(UnquantizedEmbeddingMethod):
        """vLLM's unquantized LM-head projection on hetero ``gemm`` (the weight, tied or not, stays as loaded)."""

        def __init__(self, site: str, vllm_class: str) -> None:
            super().__init__()
            self.hetero_site = site
            self.vllm_class = vllm_class

        def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
            return  # vLLM-CPU would add a packed copy for its own GEMM

        def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
            return _hetero_gemm(self.hetero_site, x, layer.weight, bias)

    return HeteroUnquantizedLinearMethod, HeteroUnquantizedEmbeddingMethod


@functools.cache
def _layer_class(base: type, stock_method: type, hetero_method: type) -> type:
    """A subclass of vLLM layer ``base`` whose plain ``stock_method`` instances become ``hetero_method``."""
    name = base.__name__

    def __init__(self, *args, **kwargs):
        base.__init__(self, *args, **kwargs)
        self.hetero_site = None
        if type(self.quant_method) is not stock_method:
            return  # quantized: the quant method's own route (or vLLM's kernel), which the census reports
        if _opted_out(name):
            report.not_routed(f"{name}[custom_ops]", f"turned off by compilation_config.custom_ops (-{name} or -gemm)")
            return
        self.hetero_site = report.site(name)
        self.quant_method = hetero_method(self.hetero_site, name)

    doc = f"vLLM's {name} with its unquantized GEMM on hetero ``gemm`` (``-{name}`` or ``-gemm`` in custom_ops: off)."
    return type(f"Hetero{name}", (base,), {"__init__": __init__, "__doc__": doc, "hetero_route": True})


def register() -> list[str]:
    """Register the linear-layer and LM-head replacements; returns the vLLM class names now routed."""
    from vllm.model_executor.layers import linear
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, UnquantizedEmbeddingMethod

    linear_method, embedding_method = _methods()
    routes: list[str] = []
    for name in LINEAR_CLASSES:
        vllm_cls = getattr(linear, name)
        register_oot(vllm_cls, _layer_class(vllm_cls, linear.UnquantizedLinearMethod, linear_method), routes)
    register_oot(ParallelLMHead, _layer_class(ParallelLMHead, UnquantizedEmbeddingMethod, embedding_method), routes)
    return routes
