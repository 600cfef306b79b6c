"""The report lists what vLLM built in the process: a subclass with its own forward and a direct ``forward_native``
call show as not routed, a part of a routed layer does not."""

from __future__ import annotations

import json

from test_plugin import _python


def test_report_lists_what_was_built_and_what_never_called_hetero():
    proc = _python(
        """
        import json
        import torch
        import hetero_vllm
        from hetero_vllm import report
        hetero_vllm.register()
        from vllm.config import VllmConfig, set_current_vllm_config
        from vllm.model_executor.layers.layernorm import RMSNorm

        class PlantedRMSNorm(RMSNorm):
            def forward_native(self, x, residual=None):
                return x

            forward_cpu = forward_native

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.routed = RMSNorm(64)
                self.bypassed = RMSNorm(64)
                self.planted = PlantedRMSNorm(64)

        with set_current_vllm_config(VllmConfig()):
            model = Model()
        x = torch.randn(3, 64)
        model.routed(x)
        model.bypassed.forward_native(x)
        model.planted(x)
        print(json.dumps(report.snapshot()))
        """,
        HETERO_VLLM="1",
        HETERO_BACKEND="cpu_ref",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["routed"] == {"RMSNorm": {"rms_norm": 1}}
    assert out["instances"] == {"RMSNorm": {"built": 2, "called": 1}}
    assert out["not_routed"]["RMSNorm"].startswith("1 of 2 built instances never called hetero")
    assert "PlantedRMSNorm defines its own forward" in out["not_routed"]["PlantedRMSNorm"]
    assert set(out["not_routed"]) == {"RMSNorm", "PlantedRMSNorm"}
