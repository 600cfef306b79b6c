"""Source texts of the test plugins the registry tests install."""

GEMM_ONLY_PLUGIN = """
import torch
import hetero
from hetero.spec import SPEC_VERSION


class MyChip(hetero.Backend):
    name = "{name}"
    device_type = "cpu"
    priority = {priority}
    spec_version = {spec_version}

    @classmethod
    def probe(cls):
        return hetero.Availability(ok={ok}, reason="{reason}", device_name="mychip-1")

    def gemm(self, a, b, *, bias=None, out_dtype=None):
        out = torch.matmul(a.float(), b.float().T)
        if bias is not None:
            out = out + bias.float()
        return out.to(out_dtype or a.dtype)


@hetero.hookimpl
def hetero_backends():
    return [MyChip]
"""


def gemm_only_plugin(name="mychip", *, priority=50, ok=True, reason="", spec_version="SPEC_VERSION") -> str:
    return GEMM_ONLY_PLUGIN.format(name=name, priority=priority, ok=ok, reason=reason, spec_version=spec_version)


BROKEN_ON_IMPORT = """
raise RuntimeError("vendor runtime libvendor.so not found")
"""

EXITS_ON_IMPORT = """
import sys
sys.exit(3)
"""

UNMARKED_HOOK = """
import hetero

class Quiet(hetero.Backend):
    name = "quiet"
    spec_version = hetero.SPEC_VERSION

def hetero_backends():  # forgot @hetero.hookimpl
    return [Quiet]
"""

RMS_NORM_OVERRIDE = """
import hetero


def fast_rms_norm(x, weight, eps, *, residual=None):
    from hetero_cpu_ref.layers import rms_norm
    return rms_norm(x, weight, eps, residual=residual)


def _supports(**static):
    return None if static.get("dtype", "float32") != "float64" else "float64 is not accelerated"


fast_rms_norm.supports = _supports


@hetero.hookimpl
def hetero_op_overrides(backend_name):
    return {{"rms_norm": fast_rms_norm}} if backend_name == "{target}" else None
"""
