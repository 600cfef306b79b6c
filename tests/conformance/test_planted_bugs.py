"""The suite proves itself: every planted bug fails on its op and on no other op."""

from __future__ import annotations

import pytest
from broken_backends import BUGS, make_plugin
from broken_compress import make_control as make_compress_control
from broken_compressed_attention import make_control as make_compressed_attention_control
from broken_dsa import make_control as make_dsa_control
from broken_hyper import make_control as make_hyper_control
from broken_moe import make_control as make_moe_control
from broken_quant import make_control as make_quant_control
from broken_recurrent import make_control
from broken_sampling import make_control as make_sampling_control

import hetero
import hetero_cpu_ref.plugin
from hetero_conformance.cases import catalog
from hetero_conformance.runner import FAILING, Runner

QUICK = catalog(quick=True)


@pytest.fixture(scope="module")
def suite():
    """A registry with the reference, and one oracle cache shared by every backend checked."""
    registry = hetero.Registry(entry_points=[])
    registry.register(hetero_cpu_ref.plugin, "cpu_ref")
    reference = registry.backends["cpu_ref"].cls()
    cache: dict = {}

    def check(plugin=None) -> dict[str, list[str]]:
        """Failing cases by op. Ops whose implementation is the reference's very function
        are not run again: the reference's own run (the first test) is their verdict."""
        name = "cpu_ref"
        if plugin is not None:
            obj, name, _ = plugin
            registry.register(obj, name)
        ops = registry.load(name)
        runner = Runner(ops, reference, cache=cache)
        changed = {
            op for op in {c.op for c in QUICK} if name == "cpu_ref" or getattr(ops, op) is not getattr(reference, op)
        }
        if plugin is not None:
            assert changed == {plugin[2]}, changed
        failed: dict[str, list[str]] = {}
        for case in (c for c in QUICK if c.op in changed):
            res = runner.run(case)
            assert res.status in ("pass", *FAILING), (case.id, res.status, res.message)
            if res.status != "pass":
                failed.setdefault(case.op, []).append(f"{case.id}: {res.status}: {res.message}")
        return failed

    return check


def test_reference_passes_every_quick_case(suite):
    assert suite() == {}


def test_control_backend_passes(suite):
    """The bug-free mini attention passes: the planted bugs below are the only difference."""
    assert suite(make_plugin(None)) == {}


@pytest.mark.parametrize("op", ["causal_conv1d", "gated_delta_rule"])
def test_recurrent_control_backends_pass(suite, op):
    """The bug-free mini recurrent ops pass: their planted bugs are the only difference."""
    assert suite(make_control(op)) == {}


@pytest.mark.parametrize("op", ["write_index_k", "indexer_topk", "mla_attention", "layer_norm"])
def test_dsa_control_backends_pass(suite, op):
    """The bug-free mini DSA ops and layer_norm pass (mla_attention's dense cases too): their
    planted bugs are the only difference."""
    assert suite(make_dsa_control(op)) == {}


@pytest.mark.parametrize("op", ["fused_moe", "route"])
def test_moe_control_backends_pass(suite, op):
    """The bug-free mini fused_moe and route (spec 1.8's options) pass: their planted bugs are the only difference."""
    assert suite(make_moe_control(op)) == {}


@pytest.mark.parametrize("op", ["quantize_activation", "scaled_grouped_gemm"])
def test_quant_control_backends_pass(suite, op):
    """The bug-free mini quantized ops pass (quantize_activation bit for bit): their planted bugs are
    the only difference."""
    assert suite(make_quant_control(op)) == {}


@pytest.mark.parametrize("op", ["hc_pre", "hc_post", "hc_head"])
def test_hyper_control_backends_pass(suite, op):
    """The bug-free mini hyper-connection ops pass: their planted bugs are the only difference."""
    assert suite(make_hyper_control(op)) == {}


def test_compressed_attention_control_backend_passes(suite):
    """The bug-free mini compressed_attention (spec 1.8) passes: its planted bugs are the only difference."""
    assert suite(make_compressed_attention_control()) == {}


def test_kv_compress_control_backend_passes(suite):
    """The bug-free mini kv_compress (spec 1.8) passes: its planted bugs are the only difference."""
    assert suite(make_compress_control()) == {}


def test_rejection_sample_control_backend_passes(suite):
    """The bug-free mini rejection_sample (spec 1.10) passes: its planted bugs are the only difference."""
    assert suite(make_sampling_control()) == {}


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_planted_bug_fails_on_its_op_only(suite, bug):
    plugin = make_plugin(bug)
    failed = suite(plugin)
    assert list(failed) == [plugin[2]], failed


def test_unimplemented_ops_are_fallback_never_pass():
    class GemmOnly(hetero.Backend):
        name, spec_version = "gemm_only", hetero.SPEC_VERSION
        gemm = staticmethod(hetero_cpu_ref.plugin.CpuRefBackend.gemm)

    class Plugin:
        @hetero.hookimpl
        def hetero_backends(self):
            return [GemmOnly]

    registry = hetero.Registry(entry_points=[])
    registry.register(hetero_cpu_ref.plugin, "cpu_ref")
    registry.register(Plugin(), "gemm_only")
    runner = Runner(registry.load("gemm_only"), registry.backends["cpu_ref"].cls())
    statuses = {(c.op, runner.run(c).status) for c in QUICK if c.op in ("gemm", "rms_norm", "silu_and_mul")}
    assert ("rms_norm", "fallback") in statuses and ("silu_and_mul", "fallback") in statuses
    assert all(s == "pass" for op, s in statuses if op == "gemm") and all(
        s == "fallback" for op, s in statuses if op != "gemm"
    )
