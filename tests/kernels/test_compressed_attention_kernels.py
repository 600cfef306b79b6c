"""compressed_attention's Triton kernel (spec 1.8) under the interpreter, against the reference.

HCA (every closed entry) and CSA (a top-k list with -1 padding and entries a row cannot see) over a
batch of decode, prefill and chunked-prefill rows, with the portable tiles and with small ones (20
heads over two head blocks of 16, windows and entry lists over several tiles of 16); sinks around and
far above the rows' logits, +-20, a strided sinks view and a strided query; bf16 without lse; D = 512;
NaN in every slot no row may read; and, in a child process, malformed metadata with validation off:
the kernel must neither fault nor read outside its tensors (NaN guard zones around the caches).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from hetero.kernels.tuning import Tuning, TuningTable
from hetero.verify.inputs.compressed_attention import V4Attention
from hetero.verify.inputs.compressed_attention import compressed_attention as draw
from hetero_cpu_ref.compressed_attention import compressed_attention as ref

SMALL = {"compressed_attention": {"BLOCK_H": 16, "BLOCK_N": 16}}
H, D, BS, BSC, W, M = 20, 48, 4, 3, 6, 4
#: decode past a few windows, a chunk straddling closes, a prompt shorter than the window, a decode at
#: a just-closed window, a fresh prompt, a longer decode whose list spans tiles
SEQS = [(1, 21), (7, 19), (3, 3), (1, 16), (5, 5), (1, 90)]


@pytest.fixture(params=["interpreter", "small-tiles"])
def tune(request, triton_backend):
    if request.param == "interpreter":
        return triton_backend.tune
    return Tuning(TuningTable(vendor="test", archs={"small": SMALL}), "small", interpreted=True)


def _args(mode: str, dtype: torch.dtype, seed: int, *, h: int = H, d: int = D, seqs=SEQS, topk: int = 20):
    build = draw(V4Attention(h, d, W), M, seqs, bs=BS, bsc=BSC, topk=topk if mode == "csa" else 0, beyond=2)
    args = build(torch.Generator().manual_seed(seed), dtype)
    args.pop("return_lse")
    return args


def _sinks(kind: str, h: int = H) -> torch.Tensor:
    if kind == "share":  # around the rows' lse, and the last head (second head block) far above it
        return torch.cat([torch.linspace(-1.0, 4.0, h - 1), torch.tensor([12.0])])
    if kind == "pm20":
        return 20.0 * (1.0 - 2.0 * (torch.arange(h) % 2)).float()
    return torch.linspace(-2.0, 6.0, 2 * h)[::2]  # "strided": a view with stride 2


@pytest.mark.parametrize("mode", ["hca", "csa"])
@pytest.mark.parametrize("kind", ["share", "strided"])
def test_kernel_matches_reference(tune, mode, kind):
    from hetero.kernels.compressed_attention import compressed_attention

    args = {**_args(mode, torch.float32, seed=1), "sinks": _sinks(kind)}
    if kind == "strided":  # the query as a view: every other row of a wider tensor
        q = args["query"]
        args["query"] = torch.stack([q, torch.full_like(q, float("nan"))], dim=1).flatten(0, 1)[::2]
    out, lse = compressed_attention(**args, return_lse=True, tuning=tune)
    want, want_lse = ref(**args, return_lse=True)
    torch.testing.assert_close(out, want, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(lse, want_lse, rtol=2e-5, atol=2e-5)


def test_bf16_sinks_pm20_without_lse(tune):
    from hetero.kernels.compressed_attention import compressed_attention

    for mode in ("hca", "csa"):
        args = {**_args(mode, torch.bfloat16, seed=2), "sinks": _sinks("pm20")}
        got = compressed_attention(**args, tuning=tune)
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), ref(**args).float(), rtol=2e-2, atol=2e-2)


def test_head_dim_512(triton_backend):
    """DeepSeek-V4's D = 512 (one padded tile of the full head), CSA with a top 8."""
    from hetero.kernels.compressed_attention import compressed_attention

    args = _args("csa", torch.float32, seed=3, h=16, d=512, seqs=[(1, 40), (4, 12)], topk=8)
    out, lse = compressed_attention(**args, return_lse=True, tuning=triton_backend.tune)
    want, want_lse = ref(**args, return_lse=True)
    torch.testing.assert_close(out, want, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(lse, want_lse, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("mode", ["hca", "csa"])
def test_unseen_slots_never_reach_the_output(tune, mode):
    """NaN in every raw slot outside all windows and in every cache slot no sequence uses."""
    from hetero.kernels.compressed_attention import compressed_attention

    args = _args(mode, torch.float32, seed=4)
    meta, kv, comp = args["meta"], args["kv_cache"], args["comp_cache"]
    keep_kv, keep_comp = torch.zeros(kv.shape[:2], dtype=torch.bool), torch.zeros(comp.shape[:2], dtype=torch.bool)
    for b, (n, length) in enumerate(SEQS):
        for j in range(max(0, length - n - W + 1), length):
            keep_kv[meta.block_table[b, j // BS], j % BS] = True
        for w in range(length // M):
            keep_comp[args["comp_block_table"][b, w // BSC], w % BSC] = True
    args["kv_cache"] = torch.where(keep_kv[..., None], kv, float("nan"))
    args["comp_cache"] = torch.where(keep_comp[..., None], comp, float("nan"))
    out = compressed_attention(**args, tuning=tune)
    torch.testing.assert_close(out, ref(**args), rtol=2e-5, atol=2e-5)


def test_malformed_metadata_is_memory_safe():
    env = dict(os.environ, HETERO_TRITON_INTERPRET="1", TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK 6"), proc.stdout[-2000:] + proc.stderr[-3000:]


def test_compiles_for_sm90_without_a_gpu():
    """The interpreter runs constructs a GPU compile rejects (a plain float global, say): compile the kernel
    for sm90 with ptxas, both modes, in bf16 at D = 512 and the portable tiles (no spill to local memory)."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "HETERO_TRITON_INTERPRET")}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    proc = subprocess.run([sys.executable, __file__, "compile"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.count("LOCAL:0") == 2, proc.stdout[-2000:] + proc.stderr[-3000:]


# ----------------------------------------------------------------------------- child


def _guarded(x: torch.Tensor, pad: int = 4096) -> torch.Tensor:
    """x as a view into a buffer with ``pad`` NaN elements on each side: a read past it shows as NaN."""
    buf = torch.full((x.numel() + 2 * pad,), float("nan"), dtype=x.dtype)
    buf[pad : pad + x.numel()] = x.flatten()
    return buf[pad : pad + x.numel()].view(x.shape)


def _child() -> None:
    """Each malformed call returns (garbage allowed) without a fault or a read into the guard zones."""
    from dataclasses import replace

    from hetero.kernels import TritonBackend
    from hetero.kernels.compressed_attention import compressed_attention

    tune, big = TritonBackend().tune, 10**6
    done = 0
    for mode in ("hca", "csa"):
        base = _args(mode, torch.float32, seed=5)
        base["kv_cache"], base["comp_cache"] = _guarded(base["kv_cache"]), _guarded(base["comp_cache"])
        meta, ctab = base["meta"], base["comp_block_table"]
        bad_table = meta.block_table.clone()
        bad_table[0, 0], bad_table[1, 1], bad_table[5, 2] = big, -3, -big
        bad_ctab = ctab.clone()
        bad_ctab[0, 0], bad_ctab[5, 1] = big, -2
        long_seq = meta.seq_lens.clone()
        long_seq[5] = big  # past every table's columns
        calls = [
            {"meta": replace(meta, block_table=bad_table), "comp_block_table": bad_ctab},
            {"meta": replace(meta, seq_lens=long_seq, max_seq_len=big), "comp_block_table": ctab[:, :1].clone()},
            {"meta": replace(meta, query_start_loc=torch.tensor([0, 5, 3, 30, 31, 36, 2], dtype=torch.int32))},
        ]
        for change in calls:
            args = {**base, **change}
            if mode == "csa":
                args["topk_indices"] = base["topk_indices"].clone().fill_(big)
                args["topk_indices"][:, 0] = -big
            out = compressed_attention(**args, tuning=tune)
            rows = torch.isfinite(out).flatten(1).all(dim=1)
            assert rows.all(), f"{mode} {sorted(change)}: non-finite rows {(~rows).nonzero().flatten().tolist()}"
            done += 1
    print(f"OK {done}")


def _compile() -> None:
    """Compile for sm90 (no device needed) and print ptxas's resource usage of each variant."""
    import inspect
    import pathlib
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from hetero.kernels._compressed_attention_kernels import compressed_attention_kernel as kernel

    names = list(inspect.signature(kernel.fn).parameters)
    ptrs = {n: "*bf16" for n in ("q_ptr", "kv_ptr", "comp_ptr", "out_ptr")}
    ptrs.update({n: "*i32" for n in ("table_ptr", "ctable_ptr", "idx_ptr")})
    ptrs.update(
        {"row_seq_ptr": "*i64", "row_pos_ptr": "*i64", "lse_ptr": "*fp32", "sinks_ptr": "*fp32", "scale": "fp32"}
    )
    cuobjdump = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    for topk in (False, True):
        const = dict(BS=64, BSC=16, D=512, D_P=512, HAS_TOPK=topk, RETURN_LSE=True, HAS_SINKS=True, UPCAST=False,
                     RNE_BF16=False, DOT_PREC="ieee", BLOCK_H=16, BLOCK_N=16)  # fmt: skip
        sig = {n: "constexpr" if n in const else ptrs.get(n, "i32") for n in names}
        compiled = triton.compile(
            ASTSource(kernel, sig, const), target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}
        )
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(compiled.asm["cubin"])
            f.flush()
            usage = subprocess.run([str(cuobjdump), "-res-usage", f.name], capture_output=True, text=True).stdout
        print(f"HAS_TOPK={topk}", *[ln.strip() for ln in usage.splitlines() if "REG:" in ln])


if __name__ == "__main__":
    _compile() if sys.argv[1:] == ["compile"] else _child()
