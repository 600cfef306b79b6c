"""Dispatch overhead: what it costs to call an op through ``hetero`` compared with other routes.

Not part of the test run (pyproject's testpaths is ``tests``). Run:

    .venv/bin/python -m pytest benchmarks/ --benchmark-only

To measure dispatch rather than the op, the main group uses an op that does
(almost) nothing: an in-process test backend whose ``silu_and_mul`` returns its
argument, registered on a private ``hetero.Registry``. Each benchmarked callable
makes UNROLL identical calls so the harness's own per-iteration cost is spread
thin; conftest.py divides by UNROLL and prints the per-call medians and the
derived figures at the end of the session.

Variants (group "dispatch"):
  direct          fn(x), fn the identity function held in a local
  hetero_ops      ops.silu_and_mul(x), ops = registry.load("bench_identity")
  pluggy_hook     pm.hook.bench_op(x=x), one hookimpl returning x (firstresult)
  direct_clone    clone(x), a plain function returning x.clone()
  custom_op       a torch.library.custom_op returning x.clone() (a custom op may
                  not return its input), called as the op object and as
                  torch.ops.<ns>.<name>.default
Group "seam": a layer's op call (``SiluAndMul.forward``, the identity op above) on a
layer the op-call seam never touched, on one instrumented then restored, on one
instrumented with a pass-through hook (what the seam costs while on), and on one
``hetero profile`` profiled (``hetero.tools.profile.Profiler``) and then stopped:
profiling costs nothing once it is off.
Group "real_op": the reference silu_and_mul on a [1, 8] float32 tensor, called
directly from hetero_cpu_ref.layers, through the Ops of a private test backend
bound to it, and through hetero.load("cpu_ref") (skipped if that plugin does not load).
"""

from __future__ import annotations

import pluggy
import pytest
import torch

import hetero
import hetero_cpu_ref.layers
from hetero.spec import SPEC_VERSION

UNROLL = 10
OPTIONS = dict(min_time=2e-5, max_time=1.0, warmup=True, warmup_iterations=20000, disable_gc=True)


# ----------------------------------------------------------------------------- the routes


def identity(x):
    return x


def clone(x):
    return x.clone()


class IdentityBackend(hetero.Backend):
    """A backend for this benchmark only: silu_and_mul returns its argument."""

    name = "bench_identity"
    device_type = "cpu"
    priority = -10_000
    spec_version = SPEC_VERSION

    silu_and_mul = staticmethod(identity)


class IdentityPlugin:
    @hetero.hookimpl
    def hetero_backends(self):
        return [IdentityBackend]


class LayersBackend(hetero.Backend):
    """A backend for this benchmark only: the reference silu_and_mul, whatever the cpu_ref plugin's state."""

    name = "bench_layers"
    device_type = "cpu"
    priority = -10_000
    spec_version = SPEC_VERSION

    silu_and_mul = staticmethod(hetero_cpu_ref.layers.silu_and_mul)


class LayersPlugin:
    @hetero.hookimpl
    def hetero_backends(self):
        return [LayersBackend]


def make_ops(plugin=IdentityPlugin, name="bench_identity", fn=identity) -> hetero.Ops:
    registry = hetero.Registry(entry_points=[], env={})
    registry.register(plugin(), name=name)
    ops = registry.load(name)
    assert ops.silu_and_mul is fn, ops.explain()["silu_and_mul"]
    return ops


bench_spec = pluggy.HookspecMarker("hetero_bench")
bench_impl = pluggy.HookimplMarker("hetero_bench")


class BenchSpec:
    @bench_spec(firstresult=True)
    def bench_op(self, x):
        """Return x."""


class BenchImpl:
    @bench_impl
    def bench_op(self, x):
        return x


def make_pluggy() -> pluggy.PluginManager:
    pm = pluggy.PluginManager("hetero_bench")
    pm.add_hookspecs(BenchSpec)
    pm.register(BenchImpl())
    return pm


@torch.library.custom_op("hetero_bench::clone_ident", mutates_args=())
def clone_ident(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@clone_ident.register_fake
def _(x):
    return torch.empty_like(x)


# ----------------------------------------------------------------------------- benchmarks

X = torch.zeros(1)


def unrolled(call_once_src: str, **env):
    """A function making UNROLL copies of the call expression, its names bound as locals."""
    body = "\n".join(f"    {call_once_src}" for _ in range(UNROLL))
    src = f"def make({', '.join(env)}):\n  def run():\n{body}\n  return run\n"
    scope: dict = {}
    exec(compile(src, f"<bench {call_once_src}>", "exec"), scope)
    return scope["make"](**env)


CASES = {
    "direct": lambda: unrolled("fn(x)", fn=identity, x=X),
    "hetero_ops": lambda: unrolled("ops.silu_and_mul(x)", ops=make_ops(), x=X),
    "pluggy_hook": lambda: unrolled("pm.hook.bench_op(x=x)", pm=make_pluggy(), x=X),
    "direct_clone": lambda: unrolled("fn(x)", fn=clone, x=X),
    "custom_op": lambda: unrolled("op(x)", op=clone_ident, x=X),
    "custom_op_torch_ops": lambda: unrolled("op(x)", op=torch.ops.hetero_bench.clone_ident.default, x=X),
}


@pytest.mark.benchmark(group="dispatch", **OPTIONS)
@pytest.mark.parametrize("variant", list(CASES))
def test_dispatch(benchmark, variant, dispatch_results):
    run = CASES[variant]()
    run()  # fail early rather than benchmark an error
    benchmark(run)
    dispatch_results.record("dispatch", variant, benchmark)


def seam_layer(state: str):
    """A SiluAndMul over the identity op: "fresh", "restored" (instrumented, then restored), "instrumented",
    or "profiled" (profiled over one call, then stopped)."""
    from hetero.engine.context import ModelContext
    from hetero.engine.instrument import instrument
    from hetero.engine.layers.activation import SiluAndMul
    from hetero.engine.parallel import Parallel

    ops = make_ops()
    layer = SiluAndMul(ModelContext(ops=ops, parallel=Parallel(), dtype=torch.float32, device=torch.device("cpu")))
    if state == "profiled":
        from hetero.tools.profile import Profiler

        with Profiler(layer) as profiler:
            layer.forward(X)
        assert len(profiler.report().calls) == 1 and layer._op is ops.silu_and_mul
    elif state != "fresh":
        handle = instrument(layer, lambda site, fn, args, kwargs: fn(*args, **kwargs))
        if state == "restored":
            handle.restore()
            assert layer._op is ops.silu_and_mul
    return layer


SEAM = {
    state: (lambda state=state: unrolled("f(x)", f=seam_layer(state).forward, x=X))
    for state in ("fresh", "restored", "instrumented", "profiled")
}


@pytest.mark.benchmark(group="seam", **OPTIONS)
@pytest.mark.parametrize("variant", list(SEAM))
def test_seam(benchmark, variant, dispatch_results):
    run = SEAM[variant]()
    run()
    benchmark(run)
    dispatch_results.record("seam", variant, benchmark)


REAL_X = torch.randn(1, 8, generator=torch.Generator().manual_seed(0))


def load_cpu_ref() -> hetero.Ops:
    try:
        return hetero.load("cpu_ref")
    except hetero.BackendUnavailable as e:
        pytest.skip(f"the installed cpu_ref plugin does not load: {e}")


REAL = {
    "direct_layers": lambda: unrolled("layers.silu_and_mul(x)", layers=hetero_cpu_ref.layers, x=REAL_X),
    "hetero_ops_private": lambda: unrolled(
        "ops.silu_and_mul(x)", ops=make_ops(LayersPlugin, "bench_layers", hetero_cpu_ref.layers.silu_and_mul), x=REAL_X
    ),
    "hetero_load_cpu_ref": lambda: unrolled("ops.silu_and_mul(x)", ops=load_cpu_ref(), x=REAL_X),
}


@pytest.mark.benchmark(group="real_op", **OPTIONS)
@pytest.mark.parametrize("variant", list(REAL))
def test_real_op(benchmark, variant, dispatch_results):
    run = REAL[variant]()
    run()
    benchmark(run)
    dispatch_results.record("real_op", variant, benchmark)
