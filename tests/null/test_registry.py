"""Discovery, guarded loading, allow/block lists, selection and errors of the plugin registry."""

from __future__ import annotations

import pytest
import torch
from plugin_sources import BROKEN_ON_IMPORT, EXITS_ON_IMPORT, RMS_NORM_OVERRIDE, UNMARKED_HOOK, gemm_only_plugin

import hetero
from hetero import BackendIncompatible, BackendNotFound, BackendUnavailable, OpNotAvailable, Registry
from hetero.spec import OP_NAMES


def test_external_plugin_is_discovered_and_loaded(make_dist):
    dist = make_dist("mychip", gemm_only_plugin())
    reg = Registry()
    assert {"cpu_ref", "mychip"} <= set(reg.names())
    assert reg.plugins["mychip"].dist == dist and reg.plugins["mychip"].version == "0.3.1"
    ops = reg.load("mychip")
    a, b = torch.randn(5, 7), torch.randn(3, 7)
    torch.testing.assert_close(ops.gemm(a, b), a @ b.T)
    info = ops.explain()
    assert info["gemm"].origin == "backend"
    assert info["gemm"].implementation.endswith("MyChip.gemm")
    for op in OP_NAMES:
        if op != "gemm":
            assert info[op].origin == "fallback", op
            assert info[op].implementation.startswith("hetero_cpu_ref."), info[op]
            assert "not implemented by backend 'mychip'" in info[op].reasons[0]


def test_fallback_op_is_the_reference_function_itself(make_dist):
    make_dist("mychip", gemm_only_plugin())
    ops = Registry().load("mychip")
    from hetero_cpu_ref import layers

    assert ops.silu_and_mul is layers.silu_and_mul  # no wrapper: one Python call


@pytest.mark.parametrize("source", [BROKEN_ON_IMPORT, EXITS_ON_IMPORT], ids=["raises", "sys.exit"])
def test_broken_plugin_is_recorded_and_the_others_still_load(make_dist, source):
    make_dist("badchip", source)
    make_dist("mychip", gemm_only_plugin())
    reg = Registry()
    record = reg.plugins["badchip"]
    assert record.status == "broken" and "import of" in record.error and record.traceback
    assert reg.plugins["mychip"].status == "loaded"
    reg.load("mychip")
    reg.load("cpu_ref")
    with pytest.raises(BackendUnavailable, match="badchip.*broken"):
        reg.load("badchip")


def test_plugin_without_marked_hooks_is_broken_with_a_hint(make_dist):
    make_dist("quiet", UNMARKED_HOOK)
    record = Registry().plugins["quiet"]
    assert record.status == "broken" and "@hetero.hookimpl" in record.error


def test_allow_list_and_block_list(make_dist):
    make_dist("mychip", gemm_only_plugin())
    allowed = Registry(env={"HETERO_PLUGINS": "cpu_ref"})
    assert allowed.plugins["mychip"].status == "disabled"
    with pytest.raises(BackendUnavailable, match="not in HETERO_PLUGINS"):
        allowed.load("mychip")
    blocked = Registry(env={"HETERO_DISABLE_PLUGINS": "mychip"})
    assert blocked.plugins["mychip"].status == "disabled"
    assert blocked.plugins["cpu_ref"].status == "loaded"
    with pytest.raises(BackendUnavailable, match="HETERO_DISABLE_PLUGINS"):
        blocked.load("mychip")


def test_op_override_from_another_package(make_dist):
    make_dist("mychip", gemm_only_plugin())
    make_dist("fastnorm", RMS_NORM_OVERRIDE.format(target="mychip"))
    reg = Registry()
    ops = reg.load("mychip")
    info = ops.explain()["rms_norm"]
    assert info.origin == "override:fastnorm" and info.implementation.endswith("fast_rms_norm")
    x, w = torch.randn(4, 16), torch.randn(16)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w)
    # the override's own supports() declines float64: resolve falls back and says why
    from hetero_cpu_ref import layers

    assert ops.resolve("rms_norm", dtype="float32") is ops.rms_norm
    assert ops.resolve("rms_norm", dtype="float64") is layers.rms_norm
    # the override predates the spec 1.2 options: a layer that sets one gets the reference, and the reason
    assert ops.resolve("rms_norm", dtype="float32", weight_offset=1.0) is layers.rms_norm
    assert any("takes no 'weight_offset'" in r for r in ops.explain()["rms_norm"].reasons)
    assert "float64 is not accelerated" in ops.explain()["rms_norm"].reasons[0]
    assert reg.load("cpu_ref").explain()["rms_norm"].origin == "backend"  # other backends untouched


def test_unknown_name_suggests_the_closest(monkeypatch):
    reg = Registry()
    with pytest.raises(BackendNotFound, match="did you mean 'cpu_ref'") as err:
        reg.load("cpu_rf")
    assert "cpu_ref" in err.value.known
    monkeypatch.setenv("HETERO_BACKEND", "cpu_rf")
    with pytest.raises(BackendNotFound, match="cpu_rf"):
        hetero.load()  # a typo in the environment never falls back silently


def test_env_selects_by_name():
    assert Registry(env={"HETERO_BACKEND": "cpu_ref"}).load().name == "cpu_ref"


def test_auto_selection_by_priority_skips_unavailable(make_dist):
    make_dist("hichip", gemm_only_plugin("hichip", priority=100, ok=False, reason="no hichip device visible"))
    make_dist("midchip", gemm_only_plugin("midchip", priority=10))
    reg = Registry(env={})
    assert reg.select() == "midchip"
    assert reg.load().name == "midchip"
    with pytest.raises(BackendUnavailable, match="no hichip device visible"):
        reg.load("hichip")
    assert Registry(env={"HETERO_PLUGINS": "cpu_ref"}).select() == "cpu_ref"  # the reference is last


def test_index_in_name_selects_the_device(make_dist):
    make_dist("mychip", gemm_only_plugin())
    reg = Registry()
    assert reg.load("mychip:1").device == torch.device("cpu", 1)
    assert reg.load("mychip", device="cpu:2").device == torch.device("cpu", 2)


def test_strict_refuses_fallback(make_dist):
    make_dist("mychip", gemm_only_plugin())
    ops = Registry().load("mychip", strict=True)
    ops.gemm(torch.randn(2, 3), torch.randn(4, 3))
    with pytest.raises(OpNotAvailable, match="rms_norm.*mychip.*strict"):
        ops.rms_norm(torch.randn(2, 3), torch.randn(3), 1e-6)
    with pytest.raises(OpNotAvailable, match="not an op of the spec"):
        ops.resolve("softmax")


def test_spec_major_mismatch_refuses_and_minor_warns(make_dist):
    make_dist("oldchip", gemm_only_plugin("oldchip", spec_version='"0.9.0"'))
    make_dist("newchip", gemm_only_plugin("newchip", spec_version='"1.13.0"'))
    make_dist("nochip", gemm_only_plugin("nochip", spec_version='""'))
    reg = Registry()
    with pytest.raises(BackendIncompatible, match=r"incompatible: implements spec 0.9.0 .*\(major versions differ\)"):
        reg.load("oldchip")
    with pytest.raises(BackendIncompatible, match="expected a version like"):
        reg.load("nochip")
    with pytest.warns(UserWarning, match="implements spec 1.13.0"):
        reg.load("newchip")


def test_probe_that_raises_makes_the_backend_unavailable():
    class Flaky(hetero.Backend):
        name, spec_version = "flaky", hetero.SPEC_VERSION

        @classmethod
        def probe(cls):
            raise OSError("driver crashed")

    class Plugin:
        @hetero.hookimpl
        def hetero_backends(self):
            return [Flaky]

    reg = Registry(entry_points=[])
    reg.register(Plugin(), "flaky")
    assert reg.names() == ["flaky"]
    with pytest.raises(BackendUnavailable, match="probe raised OSError: driver crashed"):
        reg.load("flaky")
    ops, avail = reg.inspect("flaky")
    assert not avail.ok and ops is not None


def test_duplicate_backend_name_keeps_the_first(make_dist):
    make_dist("mychip", gemm_only_plugin())
    make_dist("mychip-fork", gemm_only_plugin("mychip"))
    reg = Registry()
    assert reg.backends["mychip"].plugin == "mychip"
    assert "already provided by plugin 'mychip'" in reg.plugins["mychip-fork"].problems[0]


def test_bad_hook_result_marks_the_plugin_broken():
    class Plugin:
        @hetero.hookimpl
        def hetero_backends(self):
            return [object]

    reg = Registry(entry_points=[])
    record = reg.register(Plugin(), "odd")
    assert record.status == "broken" and "not a hetero.Backend subclass" in record.error


def test_loading_is_idempotent(make_dist):
    make_dist("mychip", gemm_only_plugin())
    reg = Registry()
    first = reg.backends
    loaded = [r for r in reg.plugins.values() if r.status == "loaded"]
    assert reg.backends == first and len(reg.pm.get_plugins()) == len(loaded)
