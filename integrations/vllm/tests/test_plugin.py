"""The plugin's contract without an engine: opt-in, version gate, skipping others' ops, the report, compiled ops."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import hetero_vllm
from hetero_vllm import _backend, report


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (plugin registration is process-wide) with only ``env`` opting in."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("HETERO_")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env={**base, **env}, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, False),
        ({"HETERO_VLLM": "1"}, True),
        ({"HETERO_BACKEND": "cpu_ref"}, True),
        ({"HETERO_BACKEND": "cpu_ref", "HETERO_VLLM": "0"}, False),
        ({"HETERO_VLLM_PLATFORM": "1"}, True),
        ({"HETERO_VLLM_PLATFORM": "1", "HETERO_VLLM": "0"}, False),
    ],
)
def test_opt_in(monkeypatch, env, expected):
    for name in ("HETERO_VLLM", "HETERO_BACKEND", "HETERO_VLLM_PLATFORM"):
        monkeypatch.delenv(name, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert hetero_vllm.enabled() is expected


def test_unsupported_vllm_is_refused_naming_the_range():
    hetero_vllm.check_vllm_version("0.32.0+cpu")
    with pytest.raises(RuntimeError, match=r"vLLM >=0\.32,<0\.33; this is vLLM 0\.33\.0"):
        hetero_vllm.check_vllm_version("0.33.0")


def test_not_opted_in_registers_nothing():
    proc = _python("""
        import hetero_vllm
        from vllm.model_executor.custom_op import op_registry_oot
        hetero_vllm.register()
        print(sorted(op_registry_oot))
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_register_is_idempotent_and_skips_ops_another_plugin_owns():
    proc = _python(
        """
        import json
        from vllm.model_executor.custom_op import CustomOp, op_registry_oot
        from vllm.model_executor.layers.layernorm import RMSNorm

        class VendorRMSNorm(RMSNorm):
            pass

        CustomOp.register_oot(VendorRMSNorm, name="RMSNorm")
        import hetero_vllm
        from hetero_vllm import report
        hetero_vllm.register()
        hetero_vllm.register()
        print(json.dumps({"owners": {k: v.__qualname__ for k, v in op_registry_oot.items()},
                          "not_routed": report.snapshot()["not_routed"]}))
    """,
        HETERO_VLLM="1",
        HETERO_BACKEND="cpu_ref",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["owners"]["RMSNorm"] == "VendorRMSNorm"
    assert out["owners"]["SiluAndMul"].startswith("_silu_and_mul_class")
    assert "another plugin already replaces it" in out["not_routed"]["RMSNorm"]
    assert "not routing RMSNorm" in proc.stderr


def test_report_merges_processes(tmp_path):
    report.reset()
    report.record("RMSNorm", "rms_norm")
    report.record("RMSNorm", "rms_norm")
    report.not_routed("GeluAndMul", "no hetero gelu op")
    path = tmp_path / "report.json"
    report.write(path)
    merged = report.write(path)
    report.reset()
    assert merged["routed"] == {"RMSNorm": {"rms_norm": 4}}
    assert merged["not_routed"] == {"GeluAndMul": "no hetero gelu op"}
    assert merged["processes"] == 2
    assert report.read(path) == merged


def test_ops_compile_as_opaque_nodes(cpu_ref):
    """torch.compile(fullgraph=True) traces the hetero ops without entering hetero's Python, and they run."""
    from hetero_vllm import torch_ops  # noqa: F401

    def block(x, w, res, positions, cache):
        h, res = torch.ops.hetero.fused_add_rms_norm(x, res, w, 1e-6, "RMSNorm")
        q, k = torch.ops.hetero.rotary_embedding(positions, h.view(4, 2, 32), h.view(4, 2, 32), cache, True, "Rope")
        return torch.ops.hetero.silu_and_mul(q.reshape(4, 64) + k.reshape(4, 64), "SiluAndMul"), res

    torch.manual_seed(0)
    args = (torch.randn(4, 64), torch.rand(64), torch.randn(4, 64), torch.arange(4), torch.randn(16, 32))
    eager = block(*args)
    compiled = torch.compile(block, fullgraph=True, backend="eager")(*args)
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert report.snapshot()["routed"]["SiluAndMul"]["silu_and_mul"] == 2


class _Config:
    def __init__(self, **additional):
        self.additional_config = additional


@pytest.fixture
def fresh_choice(monkeypatch):
    monkeypatch.delenv("HETERO_BACKEND", raising=False)
    _backend._configured.clear()
    yield monkeypatch
    _backend._configured.clear()


def test_additional_config_names_the_backend_and_wins_over_the_environment(fresh_choice):
    assert _backend.backend_name() is None
    fresh_choice.setenv("HETERO_BACKEND", "cuda")
    assert _backend.backend_name() == "cuda"
    _backend.remember_config(_Config())  # no hetero_backend key: the environment still decides
    assert _backend.backend_name() == "cuda"
    _backend.remember_config(_Config(hetero_backend="cpu_ref"))
    assert _backend.backend_name() == "cpu_ref"


def test_additional_config_is_read_from_vllms_current_config(fresh_choice):
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig(additional_config={"hetero_backend": "cpu_ref"})):
        _backend.remember_config()
    assert _backend.backend_name() == "cpu_ref"


def test_additional_config_rejects_a_non_name(fresh_choice):
    with pytest.raises(ValueError, match=r"additional_config\['hetero_backend'\] must be a backend name .* got 3"):
        _backend.remember_config(_Config(hetero_backend=3))
