"""The bounds of the scaled formats' weight math and layer choice (``hetero.engine.quant``), by hand: int8's
symmetric range, ceil-div scale grids, e4m3fnuz's doubled scales, and which checkpoint modules a skip list names."""

from __future__ import annotations

import pytest
import torch

from hetero.engine.quant._qmath import block_grid, dequantize, e4m3fn_to_fnuz, qmax, quantize_blocks, quantize_channels
from hetero.engine.quant.fp8 import fp8_config
from hetero.engine.quant.scaled import ScaledLinearMethod
from hetero.engine.quant.unquantized import UnquantizedLinearMethod


def test_int8_is_symmetric_at_127():
    w = torch.tensor([[1.0, -1.0, 0.5, 0.25], [-3.0, 0.0, 1.5, 3.0], [0.0, 0.0, 0.0, 0.0]])
    q, scale = quantize_channels(w, torch.int8)
    assert qmax(torch.int8) == 127.0
    assert torch.equal(scale.squeeze(1), torch.tensor([1 / 127, 3 / 127, 1.0]))
    want = torch.tensor([[127, -127, 64, 32], [-127, 0, 64, 127], [0, 0, 0, 0]], dtype=torch.int8)
    assert q.dtype == torch.int8 and torch.equal(q, want)
    assert (dequantize(q, scale) - w).abs().max() <= scale.max() / 2


def test_int8_blocks_round_to_nearest_and_keep_signs():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(130, 200, generator=gen)
    q, scale = quantize_blocks(w, torch.int8)
    assert scale.shape == (2, 2)
    full = scale.repeat_interleave(128, 0)[:130].repeat_interleave(128, 1)[:, :200]
    assert ((dequantize(q, scale) - w).abs() <= full / 2 + 1e-7).all()
    assert torch.equal(torch.sign(q.to(torch.float32)) * (q != 0), torch.sign(w) * (q != 0))


@pytest.mark.parametrize(
    "shape, grid", [((576, 300), (5, 3)), ((128, 128), (1, 1)), ((129, 127), (2, 1)), ((1, 257), (1, 3))]
)
def test_scale_grids_are_ceil_div(shape, grid):
    assert block_grid(*shape) == grid
    rows, cols = shape
    # each block of its own magnitude, so a scale read from the wrong block shows
    w = torch.randn(shape, generator=torch.Generator().manual_seed(2)) * (
        1 + torch.arange(rows)[:, None] // 128 * 10 + torch.arange(cols)[None] // 128 * 100
    )
    q, scale = quantize_blocks(w)
    assert scale.shape == grid
    full = scale.repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :cols]
    assert ((dequantize(q, scale) - w).abs() <= full * 16).all()  # half e4m3's widest step (32, in [256, 448])


def test_e4m3fnuz_conversion_keeps_every_value():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(256, 256, generator=gen) * 3
    q, scale = quantize_blocks(w)
    q[0, 0] = torch.tensor(-0.0).to(q.dtype)  # 0x80: -0 in e4m3fn, NaN in e4m3fnuz
    fnuz, fnuz_scale = e4m3fn_to_fnuz(q, scale)
    assert fnuz.dtype == torch.float8_e4m3fnuz
    assert torch.equal(fnuz_scale, scale * 2)
    assert torch.equal(dequantize(fnuz, fnuz_scale), dequantize(q, scale))


def _fp8(skip: list[str]):
    return fp8_config(
        {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [128, 128],
            "modules_to_not_convert": skip,
        }
    )


@pytest.mark.parametrize(
    "prefix, skipped",
    [
        ("model.layers.1.mlp.down_proj", True),
        ("model.layers.11.mlp.down_proj", False),  # ".1.mlp.down_proj" is not a suffix of it
        ("model.layers.21.mlp.down_proj", False),
        ("model.layers.1.self_attn.o_proj", False),
        ("model.layers.2.self_attn.qkv_proj", True),  # all of q/k/v listed
        ("model.layers.12.self_attn.qkv_proj", False),
        ("lm_head", True),
    ],
)
def test_a_skip_entry_names_a_module_or_a_whole_dotted_suffix(prefix, skipped):
    config = _fp8(["1.mlp.down_proj", "2.self_attn.q_proj", "2.self_attn.k_proj", "2.self_attn.v_proj"])
    method = config.linear_method(prefix)
    assert isinstance(method, UnquantizedLinearMethod if skipped else ScaledLinearMethod), prefix
