"""The packed int4 (W4A16) Triton paths of gemm, grouped_gemm and fused_moe, through Triton's interpreter,
against a float64 dequantize-then-multiply written here from the spec's encoding (low nibble = even
column, zero point 8 when none, the last group partial). Small problems with 16-wide tiles, so that a
launch has several tiles each way; BLOCK_K 16 with group 32 takes the one-group-per-step path, group 7
or 24 the per-element one. Codes, scales and zero points are drawn fresh: a swapped nibble, a zero point
off by 8 or a neighbour group's scale moves the result by the size of a weight."""

from __future__ import annotations

import pytest
import torch

import hetero
from hetero.kernels import Tuning, TuningTable

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


def tiles(block_k: int = 16, block_m: int = 16) -> Tuning:
    entry = {"BLOCK_M": block_m, "BLOCK_N": 16, "BLOCK_K": block_k, "GROUP_M": 2}
    keys = ("int4_gemm", "int4_grouped_gemm", "int4_fused_moe")
    return Tuning(TuningTable(vendor="test", archs={"tiny": dict.fromkeys(keys, entry)}), "tiny", interpreted=True)


def draw(gen, lead: tuple, n: int, k: int, g: int, zero_point: bool):
    """(packed uint8 [*lead, n, ceil(k/2)], scale, zero point or None, float64 dequantized [*lead, n, k])."""
    q = torch.randint(0, 16, (*lead, n, k + k % 2), generator=gen)
    b = (q[..., 0::2] | (q[..., 1::2] << 4)).to(torch.uint8)  # the pad nibble of an odd k is random too
    groups = -(-k // g)
    scale = torch.rand(*lead, n, groups, generator=gen) * 0.2 + 0.02
    zp = torch.randint(0, 16, (*lead, n, groups), generator=gen).to(torch.uint8) if zero_point else None
    col = torch.arange(k) // g
    z = 8.0 if zp is None else zp.double()[..., col]
    return b, scale, zp, (q[..., :k].double() - z) * scale.double()[..., col]


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    assert got.dtype == dtype and got.shape == want.shape
    tol = {F32: 2e-6, F16: 1e-3, BF16: 8e-3}[dtype]
    err = (got.double() - want).abs().max() / want.abs().max()
    assert err <= tol, f"max error {float(err):.2e} of max |out| > {tol}"


@pytest.mark.parametrize(("dtype", "out_dtype"), [(F32, None), (BF16, None), (F16, None), (BF16, F32)])
def test_int4_gemm(dtype, out_dtype):
    from hetero.kernels import gemm as G

    gen = torch.Generator().manual_seed(0)
    out = dtype if out_dtype is None else out_dtype
    # (M, N, K, group, BLOCK_K, zero points, bias): odd K with a partial last group, one group per step,
    # groups straddling steps, a group wider than K; 37 rows in three 16-row tiles of two-tile bands
    for m, n, k, g, bk, zp, bias in [(37, 40, 67, 32, 16, True, True), (5, 33, 45, 7, 32, False, False),
                                     (3, 18, 20, 128, 16, True, False), (1, 16, 96, 24, 64, False, True)]:  # fmt: skip
        b, scale, z, w = draw(gen, (), n, k, g, zp)
        wide = torch.randn(m, 2 * k, generator=gen).to(dtype)
        a = wide[:, ::2]  # strided a: addressed through its strides
        bv = torch.randn(n, generator=gen).to(dtype) if bias else None
        got = G.gemm(a, b, bias=bv, out_dtype=out_dtype, b_scale=scale, b_zero_point=z, group_size=g, tuning=tiles(bk))
        want = a.double() @ w.T + (bv.double() if bias else 0)
        close(got, want, out)
    empty = G.gemm(a[:0], b, b_scale=scale, b_zero_point=z, group_size=g, tuning=tiles())
    assert empty.shape == (0, n) and empty.dtype == dtype


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_int4_grouped_gemm_empty_groups_and_tail(dtype, triton_backend):
    from hetero.kernels import gemm as G

    gen = torch.Generator().manual_seed(1)
    # groups: 0 empty, 1 = 21 rows (two 16-row tiles), 2 empty, 3 = 1 row, 4 = 9 rows; 6 rows past the end
    ends = torch.tensor([0, 21, 21, 22, 31], dtype=torch.int32)
    a = torch.randn(37, 50, generator=gen).to(dtype)
    for g, zp, bk in ((32, True, 16), (24, False, 64)):
        b, scale, z, w = draw(gen, (5,), 20, 50, g, zp)
        got = triton_backend.grouped_gemm(a, b, ends, b_scale=scale, b_zero_point=z, group_size=g)
        tuned = G.grouped_gemm(a, b, ends, b_scale=scale, b_zero_point=z, group_size=g, tuning=tiles(bk))
        want = torch.zeros(37, 20, dtype=torch.float64)
        for e, (lo, hi) in enumerate(zip([0, *ends[:-1].tolist()], ends.tolist())):
            want[lo:hi] = a[lo:hi].double() @ w[e].T
        for c in (got, tuned):
            close(c, want, dtype)
            assert bool((c[31:] == 0).all())
    none = triton_backend.grouped_gemm(a[:0], b, torch.zeros(5, dtype=torch.int32), b_scale=scale, group_size=g)
    assert none.shape == (0, 20)


def _act(name: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if name == "silu":
        return torch.nn.functional.silu(gate) * up
    gate, up = gate.clamp(max=7.0), up.clamp(-7.0, 7.0)
    return (up + 1) * gate * torch.sigmoid(1.702 * gate)


def _moe_reference(x, w13, w2, b13, b2, weights, ids, activation):
    """The spec's composition in float64, with r() rounding to x's dtype."""

    def r(t):
        return t.to(x.dtype).double()

    out = torch.zeros(x.shape, dtype=torch.float64)
    inter = w13.shape[1] // 2
    for m in range(x.shape[0]):
        for s in range(ids.shape[1]):
            e = int(ids[m, s])
            gu = r(w13[e] @ x[m].double() + b13[e].double())
            h = r(_act(activation, gu[:inter], gu[inter:]))
            out[m] += weights[m, s].double() * r(w2[e] @ h + b2[e].double())
    return out


@pytest.mark.parametrize(("dtype", "activation", "zp"), [(F32, "silu", True), (BF16, "swigluoai", False)])
def test_int4_fused_moe(dtype, activation, zp, triton_backend):
    gen = torch.Generator().manual_seed(2)
    experts, top_k, rows, hidden, inter, g = 5, 2, 11, 35, 9, 16  # odd H and I: partial groups on both GEMMs
    w13, s13, z13, d13 = draw(gen, (experts,), 2 * inter, hidden, g, zp)
    w2, s2, z2, d2 = draw(gen, (experts,), hidden, inter, g, zp)
    x = torch.randn(rows, hidden, generator=gen).to(dtype)
    ids = torch.stack([torch.randperm(experts - 1, generator=gen)[:top_k] for _ in range(rows)]).int()  # e4 unused
    weights = torch.rand(rows, top_k, generator=gen)
    b13 = torch.randn(experts, 2 * inter, generator=gen).to(dtype)
    b2 = torch.randn(experts, hidden, generator=gen).to(dtype)
    limit = None if activation == "silu" else 7.0
    opts = dict(activation=activation, limit=limit, w13_bias=b13, w2_bias=b2, w13_scale=s13, w2_scale=s2)
    want = _moe_reference(x, d13, d2, b13, b2, weights, ids, activation)
    got = triton_backend.fused_moe(x, w13, w2, weights, ids, **opts, w13_zero_point=z13, w2_zero_point=z2, group_size=g)
    close(got, want, dtype)
    from hetero.kernels import moe

    tuned = moe.fused_moe(x, w13, w2, weights, ids, **opts, w13_zero_point=z13, w2_zero_point=z2, group_size=g,
                          tuning=tiles(block_m=4))  # fmt: skip
    close(tuned, want, dtype)
    assert triton_backend.fused_moe(x[:0], w13, w2, weights[:0], ids[:0], **opts, group_size=g).shape == (0, hidden)


def test_int4_rejects_bad_arguments(triton_backend):
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(4, 10)
    b, scale, z, _ = draw(gen, (), 6, 10, 4, True)
    bad = {
        "b_scale": dict(b=torch.randn(6, 10), b_scale=scale),  # a float weight takes no int4 option
        "group_size": dict(b=b, b_scale=scale),  # a packed weight needs its group size
        "b": dict(b=b[:, :4], b_scale=scale, group_size=4),  # [N, ceil(K/2)]
        "b_zero_point": dict(b=b, b_scale=scale, b_zero_point=z.int(), group_size=4),
        "b_scale ": dict(b=b, b_scale=scale[:, :2], group_size=4),  # ceil(K/g) groups
    }
    for arg, kw in bad.items():
        with pytest.raises(hetero.OpError, match=f"'{arg.strip()}'"):
            triton_backend.gemm(a, **kw)
    w13, s13, _, _ = draw(gen, (2,), 8, 10, 4, False)
    w2, s2, _, _ = draw(gen, (2,), 10, 4, 4, False)
    ids, weights = torch.zeros(4, 1, dtype=torch.int32), torch.ones(4, 1)
    with pytest.raises(hetero.OpError, match="'act_quant'"):
        triton_backend.fused_moe(a, w13, w2, weights, ids, w13_scale=s13, w2_scale=s2, group_size=4, act_quant="token")
    with pytest.raises(hetero.OpError, match="'w2_scale'"):
        triton_backend.fused_moe(a, w13, w2, weights, ids, w13_scale=s13, w2_scale=s13, group_size=4)


def test_cuda_and_rocm_bind_the_int4_paths():
    """Both Triton backends report the int4 options bound (not fallen back), and the vendor dense and grouped
    GEMM wrappers of a real GPU hand packed weights to the Triton kernels."""
    cuda_vendor = pytest.importorskip("hetero_cuda.vendor")
    rocm_vendor = pytest.importorskip("hetero_rocm.vendor")
    for name in ("cuda", "rocm"):
        ops = hetero.load(name)
        for op, static in [("gemm", {"dtype": "bfloat16", "group_size": 128, "b_zero_point": True}),
                           ("grouped_gemm", {"dtype": "float16", "group_size": 32}),
                           ("fused_moe", {"dtype": "bfloat16", "weight_dtype": "uint8", "group_size": 32,
                                          "w13_zero_point": True, "w2_zero_point": True})]:  # fmt: skip
            binding, reason = ops.native(op, **static)
            assert binding is not None and reason is None, (name, op, reason)

    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return "triton"

    a, b, s = torch.randn(2, 8, dtype=BF16), torch.zeros(4, 4, dtype=torch.uint8), torch.ones(4, 1)
    for wrap in (cuda_vendor.cublas_gemm(spy), rocm_vendor.hipblaslt_gemm(spy)):
        assert wrap(a, b, b_scale=s, group_size=8) == "triton"
    ends = torch.tensor([2], dtype=torch.int32)
    assert cuda_vendor.torch_grouped_gemm(spy)(a, b[None], ends, b_scale=s[None], group_size=8) == "triton"
    assert all(c["b_scale"] is not None and c["group_size"] == 8 for c in calls) and len(calls) == 3


def _compile() -> None:
    """``python tests/kernels/test_int4_kernels.py``: compile the hardware variants for sm90 and gfx942 (no device
    needed) and print ptxas's registers and spills (STACK) of each sm90 one."""
    import inspect
    import pathlib
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from hetero.kernels._int4_kernels import int4_gemm_kernel, int4_grouped_kernel

    cuobjdump = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    flags = dict(HAS_ZP=True, HAS_BIAS=True, UPCAST=False, SOFT_RTNE=False, BLOCK_N=64, BLOCK_K=32)
    moe = dict(GATHER=True, SWIGLU=True, ACT=1, G_POW2=512, BLOCK_M=32)
    for dt, terms, out in (("bf16", 2, "bf16"), ("bf16", 3, "fp32"), ("fp16", 2, "fp16"), ("fp32", 0, "fp32")):
        ptrs = {"a_ptr": f"*{dt}", "b_ptr": "*u8", "s_ptr": "*fp32", "z_ptr": "*u8", "bias_ptr": f"*{dt}"}
        ptrs.update(c_ptr=f"*{out}", ends_ptr="*i32", perm_ptr="*i64", ALPHA="fp32", LIMIT="fp32")
        rows = {"BLOCK_M": 16} if dt == "fp32" else {}  # int4._tiles' cap for float32 activations
        for kernel, extra in ((int4_gemm_kernel, {"GROUP_M": 8, "BLOCK_M": 64, **rows}),
                              (int4_grouped_kernel, {**moe, **rows})):  # fmt: skip
            for aligned in (True, False):
                const = {**flags, **extra, "TERMS": terms, "ALIGNED": aligned}
                names = list(inspect.signature(kernel.fn).parameters)
                sig = {n: "constexpr" if n in const else ptrs.get(n, "i32") for n in names}
                for target in (GPUTarget("cuda", 90, 32), GPUTarget("hip", "gfx942", 64)):
                    opts = {"num_warps": 4, "num_stages": 3}
                    compiled = triton.compile(ASTSource(kernel, sig, const), target=target, options=opts)
                    if target.backend != "cuda":
                        continue
                    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                        f.write(compiled.asm["cubin"])
                        f.flush()
                        res = subprocess.run([str(cuobjdump), "-res-usage", f.name], capture_output=True, text=True)
                    usage = [w for ln in res.stdout.splitlines() if "REG:" in ln for w in ln.split()[:3]]
                    print(kernel.fn.__name__, dt, f"out {out}", "aligned" if aligned else "per-element", *usage)


if __name__ == "__main__":
    _compile()
