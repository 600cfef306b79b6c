"""The linear route without an engine: ``hetero::gemm`` as an opaque compiled node, and the layer replacements
(routing, opt-out, weights kept as loaded, the causal-conv holder left to vLLM) in a fresh process."""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F
from test_plugin import _python

from hetero_vllm import report


def test_gemm_compiles_as_an_opaque_node_and_matches_linear(cpu_ref):
    """Dynamo keeps ``hetero.gemm`` as one node (its fake gives the shape), and it computes ``F.linear``."""
    from hetero_vllm.linear import _hetero_gemm

    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def proj(x, w, b):
        return torch.relu(_hetero_gemm("QKVParallelLinear#0", x, w, b))

    torch.manual_seed(0)
    x, w, b = torch.randn(2, 3, 64), torch.randn(96, 64), torch.randn(96)
    want = torch.relu(F.linear(x, w, b))
    torch.testing.assert_close(proj(x, w, b), want, rtol=1e-5, atol=1e-5)
    compiled = torch.compile(proj, fullgraph=True, backend=capture)
    torch.testing.assert_close(compiled(x, w, b), want, rtol=1e-5, atol=1e-5)
    targets = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert torch.ops.hetero.gemm in targets or torch.ops.hetero.gemm.default in targets, targets
    # aot_eager runs the fake implementation (shapes, dtype) as vLLM's Inductor compile does; no bias here
    got = torch.compile(proj, fullgraph=True, backend="aot_eager")(x[0], w, None)
    torch.testing.assert_close(got, torch.relu(F.linear(x[0], w)), rtol=1e-5, atol=1e-5)
    assert report.snapshot()["routed"]["QKVParallelLinear"]["gemm"] == 3  # eager, then each compiled run


_LAYERS = """
    import json, tempfile, torch
    import torch.nn.functional as F
    import hetero_vllm
    from hetero_vllm import report
    hetero_vllm.register()
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.layers.linear import (ColumnParallelLinear, MergedColumnParallelLinear,
        QKVParallelLinear, ReplicatedLinear, RowParallelLinear)
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(1, 0, "file://" + tempfile.mktemp(), 0, "gloo")
        initialize_model_parallel(1, 1)

    def build(custom_ops):
        with set_current_vllm_config(VllmConfig(compilation_config=CompilationConfig(custom_ops=custom_ops))):
            return {
                "ReplicatedLinear": ReplicatedLinear(64, 32, bias=False),
                "ColumnParallelLinear": ColumnParallelLinear(64, 48, bias=True),
                "MergedColumnParallelLinear": MergedColumnParallelLinear(64, [32, 32], bias=False),
                "QKVParallelLinear": QKVParallelLinear(64, 16, 4, 2, bias=True),
                "RowParallelLinear": RowParallelLinear(64, 64, bias=True),
                "ParallelLMHead": ParallelLMHead(100, 64),
            }

    out = {}
    for ops in ([], ["-QKVParallelLinear"], ["-gemm"]):
        out[",".join(ops)] = {k: type(v.quant_method).__name__ for k, v in build(ops).items()}

    torch.manual_seed(0)
    layers = build([])
    x = torch.randn(5, 64)
    errors, kept = {}, {}
    for name, layer in layers.items():
        for p in layer.parameters():
            p.data.normal_()
        ptr = layer.weight.data_ptr()
        layer.quant_method.process_weights_after_loading(layer)
        kept[name] = layer.weight.data_ptr() == ptr and layer.weight.shape[-1] == 64
        if name == "ParallelLMHead":
            got = layer.quant_method.apply(layer, x)
        else:
            got = layer(x)[0]
        errors[name] = (got - F.linear(x, layer.weight, layer.bias)).abs().max().item()
    out.update(errors=errors, kept=kept)

    with set_current_vllm_config(VllmConfig()):  # Gated DeltaNet's conv1d holder: [dim, 1, width]
        conv = ColumnParallelLinear(4, 32, bias=False, params_dtype=torch.bfloat16)
    conv.weight.data = conv.weight.data.unsqueeze(1).normal_()
    conv.quant_method.process_weights_after_loading(conv)
    out["conv"] = {"site": conv.hetero_site, "unpacked": hasattr(conv, "_cpu_unpacked_conv_weight"),
                   "avx512_bf16": torch.cpu._is_avx512_bf16_supported()}
    snap = report.snapshot()
    out["routed"], out["not_routed"] = snap["routed"], snap["not_routed"]
    print(json.dumps(out))
"""


def test_layers_route_keep_weights_opt_out_and_leave_the_conv_holder():
    proc = _python(_LAYERS, HETERO_VLLM="1", HETERO_BACKEND="cpu_ref")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    from hetero_vllm.linear import LINEAR_CLASSES as classes

    routed = {c: "HeteroUnquantizedLinearMethod" for c in classes}
    routed["ParallelLMHead"] = "HeteroUnquantizedEmbeddingMethod"
    assert out[""] == routed
    assert out["-QKVParallelLinear"] == routed | {"QKVParallelLinear": "UnquantizedLinearMethod"}
    stock = {c: "UnquantizedLinearMethod" for c in classes} | {"ParallelLMHead": "UnquantizedEmbeddingMethod"}
    assert out["-gemm"] == stock
    assert all(out["kept"].values()), out["kept"]  # no packing, no weight removal
    assert max(out["errors"].values()) < 1e-4, out["errors"]
    assert all(out["routed"][c] == {"gemm": 1} for c in routed), out["routed"]
    assert "turned off by compilation_config.custom_ops" in out["not_routed"]["QKVParallelLinear[custom_ops]"]
    # the conv weight holder keeps vLLM's processing: packed with a plain copy kept where vLLM's kernel wants it
    assert out["conv"]["site"] is None
    assert out["conv"]["unpacked"] == out["conv"]["avx512_bf16"]
    assert "not a GEMM" in out["not_routed"]["ColumnParallelLinear[3-D weight]"], out["not_routed"]
