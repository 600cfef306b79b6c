"""The spec-version rule a plugin's backend is loaded under (``hetero._plugins._version_problem``), both ways
round: another major is refused whether older or newer, another minor loads with a warning whether older or
newer, and the patch number is ignored."""

from __future__ import annotations

import pytest

from hetero import _plugins

OURS = "3.4.1"


def _status(declared) -> tuple[str, str]:
    return _plugins._version_problem(type("Declaring", (), {"spec_version": declared}))


@pytest.fixture(autouse=True)
def our_version(monkeypatch):
    # a version with room below and above in every part, whatever SPEC_VERSION is today
    monkeypatch.setattr(_plugins, "SPEC_VERSION", OURS)


@pytest.mark.parametrize("declared", ["3.4.1", "3.4.0", "3.4.9", "3.4"])
def test_same_major_and_minor_is_ok_whatever_the_patch(declared):
    assert _status(declared) == ("ok", "")


@pytest.mark.parametrize("declared", ["3.5.0", "3.3.7", "3.0.0"])
def test_another_minor_either_way_loads_with_a_warning_naming_both(declared):
    status, message = _status(declared)
    assert status == "warn"
    assert declared in message and OURS in message


@pytest.mark.parametrize("declared", ["4.0.0", "2.4.1", "2.9.9", "0.4.1"])
def test_another_major_either_way_is_refused_naming_both(declared):
    status, message = _status(declared)
    assert status == "incompatible"
    assert declared in message and OURS in message and "major" in message


@pytest.mark.parametrize("declared", ["", None, "3", "v3.4.1", "three.four"])
def test_a_missing_or_garbled_version_is_refused(declared):
    status, message = _status(declared)
    assert status == "incompatible" and "spec_version" in message


@pytest.mark.parametrize(
    "declared, status, warned",
    [("3.4.0", "ok", False), ("3.5.0", "ok", True), ("3.3.0", "ok", True), ("4.4.1", "incompatible", False)],
)
def test_a_backend_of_another_minor_is_kept_with_its_warning_and_of_another_major_is_marked(declared, status, warned):
    loader = _plugins.PluginLoader.__new__(_plugins.PluginLoader)
    loader.backends = {}
    cls = type("Declaring", (), {"name": "declaring", "spec_version": declared})
    loader._add_backend(cls, _plugins.PluginRecord("plugin", "dist", "1.0"))
    entry = loader.backends["declaring"]
    assert (entry.status, bool(entry.warnings)) == (status, warned)
    assert entry.cls is cls and bool(entry.problem) == (status == "incompatible")
