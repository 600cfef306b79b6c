"""Checks every installed backend must pass: signatures equal to the spec, and probes that answer."""

from __future__ import annotations

import pytest

import hetero
from hetero.spec import OPS

_REGISTRY = hetero.Registry()
_LOADED = sorted(n for n, e in _REGISTRY.backends.items() if e.cls is not None and e.status == "ok")


@pytest.mark.parametrize("name", _LOADED)
def test_native_ops_take_the_spec_signature(name):
    cls = _REGISTRY.backends[name].cls
    backend = cls(device="meta")
    wrong = {op: OPS[op].check_signature(getattr(backend, op)) for op in cls.native_ops()}
    assert {op: why for op, why in wrong.items() if why} == {}


@pytest.mark.parametrize("name", _LOADED)
def test_probe_answers_with_availability(name):
    avail = _REGISTRY.availability(name)
    assert isinstance(avail, hetero.Availability)
    assert avail.ok or avail.reason, f"{name}: unavailable without a reason"


def test_reference_implements_every_op():
    cls = _REGISTRY.backends["cpu_ref"].cls
    assert set(cls.native_ops()) == set(OPS)
    assert cls.priority < min(
        (e.cls.priority for n, e in _REGISTRY.backends.items() if e.cls and n != "cpu_ref"), default=0
    )
