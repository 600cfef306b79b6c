"""Backend.bind_from, the one way a backend binds functions as ops: from a family module's ``__all__`` or a
mapping, on the class (every instance) or on one instance (vendor paths chosen per device)."""

from __future__ import annotations

import functools
import types

import pytest

import hetero
from hetero.ops import Ops
from hetero.spec import OPS


def _family() -> types.ModuleType:
    module = types.ModuleType("hetero_fake.layers")

    def silu_and_mul(x):
        return x

    def helper(x):  # listed, but not a spec op: ignored
        return x

    module.silu_and_mul, module.helper, module.__all__ = silu_and_mul, helper, ["silu_and_mul", "helper"]
    return module


def _backend_class() -> type[hetero.Backend]:
    return type("Fake", (hetero.Backend,), {"name": "fake", "spec_version": hetero.SPEC_VERSION})


def test_a_module_binds_the_spec_ops_of_its_all_as_static_methods():
    cls, family = _backend_class(), _family()
    cls.bind_from(family)
    assert cls.native_ops() == ("silu_and_mul",) and not hasattr(cls, "helper")
    backend = cls()
    assert backend.silu_and_mul is family.silu_and_mul  # no self: a static method
    assert OPS["silu_and_mul"].check_signature(backend.silu_and_mul) is None
    fn = family.silu_and_mul  # explain names the function where it is defined
    assert Ops(backend, None, {}).explain()["silu_and_mul"].implementation == f"{fn.__module__}.{fn.__qualname__}"


def test_a_later_source_wins_and_a_mapping_names_only_spec_ops():
    cls, family = _backend_class(), _family()

    def silu_and_mul(x):
        return -x

    cls.bind_from(family, {"silu_and_mul": silu_and_mul})
    assert cls().silu_and_mul is silu_and_mul
    with pytest.raises(ValueError, match="'gemmm'"):
        cls.bind_from({"gemmm": silu_and_mul})


def test_on_an_instance_it_replaces_ops_of_that_instance_only():
    cls, family = _backend_class(), _family()
    cls.bind_from(family)
    fast, plain = cls(), cls()

    def vendor_silu_and_mul(x):
        return x

    fast.bind_from({"silu_and_mul": vendor_silu_and_mul})
    assert fast.silu_and_mul is vendor_silu_and_mul and plain.silu_and_mul is family.silu_and_mul
    assert Ops(fast, None, {}).explain()["silu_and_mul"].implementation.endswith("vendor_silu_and_mul")
    with pytest.raises(ValueError, match="gemm"):
        fast.bind_from({"gemm": vendor_silu_and_mul})  # the class has no gemm to replace


def test_a_per_backend_op_is_built_for_the_instance_it_is_called_on():
    cls = _backend_class()
    cls.scale = 1.0

    def scaled_silu_and_mul(x, *, scale):
        return x * scale

    spec = OPS["silu_and_mul"].signature
    op = hetero.backend.PerBackendOp(
        lambda backend: functools.partial(scaled_silu_and_mul, scale=backend.scale),
        name="silu_and_mul",
        qualname="Fake.silu_and_mul",
        module="hetero_fake.layers",
        doc="scaled",
        signature=spec,
    )
    cls.bind_from({"silu_and_mul": op})
    one, two = cls(), cls()
    two.scale = 3.0
    assert (one.silu_and_mul(2.0), two.silu_and_mul(2.0), op(two, 2.0)) == (2.0, 6.0, 6.0)
    assert one.silu_and_mul is not one.silu_and_mul  # a fresh partial per lookup: naming it never renames another
    assert OPS["silu_and_mul"].check_signature(one.silu_and_mul) is None
    assert (one.silu_and_mul.__doc__, cls.silu_and_mul) == ("scaled", op)
    assert Ops(one, None, {}).explain()["silu_and_mul"].implementation == "hetero_fake.layers.Fake.silu_and_mul"
