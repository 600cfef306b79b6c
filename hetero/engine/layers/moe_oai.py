"""gpt-oss's routed experts: ``route`` (top-k of the logits, softmax over them), then ``fused_moe`` with the
clamped ``swigluoai`` activation and per-expert biases.

The checkpoint stores every layer's experts fused and transposed, gate and up columns interleaved
(transformers' ``GptOssExperts``): ``gate_up_proj [E, H, 2I]`` (gate = ``[..., ::2]``, up = ``[..., 1::2]``),
``gate_up_proj_bias [E, 2I]`` (interleaved likewise), ``down_proj [E, I, H]``, ``down_proj_bias [E, H]``. The
weight loaders transpose and de-interleave them into the op's layout (``w13 [E, 2I, H]`` gate rows then up
rows, ``w2 [E, H, I]``) once, at load; the parameters keep the checkpoint's names.

The released checkpoints hold ``gate_up_proj`` / ``down_proj`` in MXFP4 (``*_blocks`` / ``*_scales``, already
``[out, in]``, gate/up rows interleaved; ``quantization_config.quant_method == "mxfp4"``): with ``mxfp4`` the
layer keeps those uint8 tensors (this rank's rows) and the post-load pass dequantizes them
(``hetero.engine.quant.mxfp4``) into dense w13 / w2 in the model dtype.

Tensor parallel: every rank holds each expert's I/R slice (gate and up rows, down columns) and the partial
outputs are summed by one all_reduce; the down bias lives on rank 0 only (zeros elsewhere), so it is added
once. Expert parallelism is not supported for these experts.
"""

from __future__ import annotations

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.weights import copy_checked
from hetero.engine.parallel import divide
from hetero.engine.quant.mxfp4 import MXFP4_BLOCK, dequantize_mxfp4

__all__ = ["OaiExperts"]


def _expect_shape(tensor: torch.Tensor, shape: tuple[int, ...], what: str) -> None:
    if tuple(tensor.shape) != shape:
        raise ValueError(f"{what}: expected the checkpoint shape {shape}, got {tuple(tensor.shape)}")


class OaiExperts(nn.Module):
    """``forward(x [T, H], router_logits [T, E]) -> [T, H]`` (summed over the ranks)."""

    def __init__(
        self,
        ctx: ModelContext,
        num_experts: int,
        hidden: int,
        intermediate: int,
        top_k: int,
        *,
        alpha: float,
        limit: float,
        mxfp4: bool = False,
        prefix: str = "",
    ):
        super().__init__()
        par = ctx.parallel
        if par.expert_parallel and par.size > 1:
            raise ValueError("gpt-oss experts: expert parallelism is not supported; use tensor parallelism alone")
        self.ctx, self.prefix, self.top_k, self.alpha, self.limit = ctx, prefix, top_k, float(alpha), float(limit)
        self.num_experts, self.hidden, self.intermediate = num_experts, hidden, intermediate
        self.inter = divide(intermediate, par.size, "expert intermediate size")
        self.mxfp4 = mxfp4
        e, i, h = num_experts, self.inter, hidden
        if mxfp4:
            if i % MXFP4_BLOCK or h % MXFP4_BLOCK:
                raise ValueError(
                    f"MXFP4 experts need the hidden ({h}) and per-rank intermediate ({i}) sizes in "
                    f"blocks of {MXFP4_BLOCK}"
                )
            u8, b, half = dict(dtype=torch.uint8), MXFP4_BLOCK, MXFP4_BLOCK // 2
            self._param("gate_up_proj_blocks", ctx.empty(e, 2 * i, h // b, half, **u8), self._load_rows)
            self._param("gate_up_proj_scales", ctx.empty(e, 2 * i, h // b, **u8), self._load_rows)
            self._param("down_proj_blocks", ctx.empty(e, h, i // b, half, **u8), self._load_cols)
            self._param("down_proj_scales", ctx.empty(e, h, i // b, **u8), self._load_cols)
        else:
            self._param("gate_up_proj", ctx.empty(e, 2 * i, h), self._load_gate_up)
            self._param("down_proj", ctx.empty(e, h, i), self._load_down)
        self._param("gate_up_proj_bias", ctx.empty(e, 2 * i), self._load_rows)
        self._param("down_proj_bias", ctx.empty(e, h), self._load_down_bias)
        self.w13: torch.Tensor | None = None
        self.w2: torch.Tensor | None = None
        ctx.bind_op(self, "_route", "route", scoring="softmax")
        ctx.bind_op(self, "_fused_moe", "fused_moe", activation="swigluoai")

    def _param(self, name: str, data: torch.Tensor, loader) -> None:
        p = nn.Parameter(data, requires_grad=False)
        p.weight_loader, p.shards = (lambda param, t, shard=None: loader(param, t, f"{self.prefix}.{name}")), (None,)
        self.register_parameter(name, p)

    # -- loading: checkpoint layout -> this rank's part in the op's layout ----------------
    def _rank_rows(self, t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
        """This rank's ``size`` entries of dimension ``dim`` (of I in total)."""
        return t.narrow(dim, self.ctx.parallel.rank * size, size)

    def _deinterleave(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        """Interleaved gate/up entries along ``dim`` (2I) -> this rank's [gate; up] halves (2I/R)."""
        gate, up = t.unflatten(dim, (-1, 2)).unbind(dim + 1)
        return torch.cat([self._rank_rows(gate, dim, self.inter), self._rank_rows(up, dim, self.inter)], dim)

    def _load_gate_up(self, param: nn.Parameter, t: torch.Tensor, what: str) -> None:
        _expect_shape(t, (self.num_experts, self.hidden, 2 * self.intermediate), what)
        copy_checked(param.data, self._deinterleave(t.transpose(1, 2), 1), what)

    def _load_down(self, param: nn.Parameter, t: torch.Tensor, what: str) -> None:
        _expect_shape(t, (self.num_experts, self.intermediate, self.hidden), what)
        copy_checked(param.data, self._rank_rows(t.transpose(1, 2), 2, self.inter), what)

    def _load_rows(self, param: nn.Parameter, t: torch.Tensor, what: str) -> None:
        """gate_up bias, blocks or scales: interleaved gate/up along dimension 1."""
        _expect_shape(t, (self.num_experts, 2 * self.intermediate, *param.shape[2:]), what)
        copy_checked(param.data, self._deinterleave(t, 1), what)

    def _load_cols(self, param: nn.Parameter, t: torch.Tensor, what: str) -> None:
        """down blocks or scales: [E, H, I/32, ...], this rank's blocks of I."""
        blocks = self.intermediate // MXFP4_BLOCK
        _expect_shape(t, (self.num_experts, self.hidden, blocks, *param.shape[3:]), what)
        copy_checked(param.data, self._rank_rows(t, 2, self.inter // MXFP4_BLOCK), what)

    def _load_down_bias(self, param: nn.Parameter, t: torch.Tensor, what: str) -> None:
        copy_checked(param.data, t if self.ctx.parallel.rank == 0 else torch.zeros_like(t), what)

    def post_load(self) -> None:
        """w13 / w2 for ``fused_moe``: the float parameters themselves, or the MXFP4 ones dequantized."""
        if not self.mxfp4:
            self.w13, self.w2 = self.gate_up_proj.data, self.down_proj.data
            return
        dtype = self.ctx.dtype
        self.w13 = dequantize_mxfp4(self.gate_up_proj_blocks.data, self.gate_up_proj_scales.data, dtype)
        self.w2 = dequantize_mxfp4(self.down_proj_blocks.data, self.down_proj_scales.data, dtype)
        for name in ("gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks", "down_proj_scales"):
            param = getattr(self, name)  # the packed copy is not needed after this: free it
            param.data = param.data.new_empty((0,) * param.ndim)

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        if self.w13 is None:
            raise RuntimeError(f"{self.prefix}: no expert weights; the loader's post-load pass sets them")
        weights, ids = self._route(router_logits, top_k=self.top_k, scoring="softmax", renormalize=True)
        out = self._fused_moe(
            x,
            self.w13,
            self.w2,
            weights,
            ids,
            activation="swigluoai",
            alpha=self.alpha,
            limit=self.limit,
            w13_bias=self.gate_up_proj_bias,
            w2_bias=self.down_proj_bias,
        )
        return self.ctx.parallel.all_reduce(out)
