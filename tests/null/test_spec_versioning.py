"""The spec's versioning rules as docs/spec-changes.md states them, and the docs kept in step with the code."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
from plugin_sources import gemm_only_plugin

from hetero import BackendIncompatible, Registry
from hetero.spec import OPS, SPEC_VERSION

DOC = Path(__file__).resolve().parents[2] / "docs" / "spec-changes.md"
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")


def _parts(version: str) -> tuple[int, int, int]:
    m = SEMVER.match(version)
    assert m, version
    return tuple(int(p) for p in m.groups())  # type: ignore[return-value]


def _doc() -> str:
    return DOC.read_text(encoding="utf-8")


def test_spec_version_is_semver():
    assert SEMVER.match(SPEC_VERSION), f"SPEC_VERSION {SPEC_VERSION!r} is not MAJOR.MINOR.PATCH"


def test_changelog_has_a_section_for_the_current_version():
    headings = re.findall(r"^##\s+(\d+\.\d+\.\d+)\b", _doc(), flags=re.M)
    assert SPEC_VERSION in headings, f"docs/spec-changes.md has no '## {SPEC_VERSION}' section (found {headings})"
    released = [_parts(v) for v in headings]
    assert max(released) == _parts(SPEC_VERSION), "a documented version is newer than SPEC_VERSION"


def test_changelog_mentions_every_op():
    text = _doc()
    missing = [op for op in OPS if f"`{op}`" not in text]
    assert not missing, f"docs/spec-changes.md does not mention {missing}"


def test_planned_versions_are_marked_as_not_released():
    text = _doc()
    planned = text.split("## Planned", 1)
    assert len(planned) == 2 and "not released" in planned[1].splitlines()[0]
    for op in ("ep_dispatch", "ep_combine", "sparse_mla_attention", "gated_delta_rule"):
        assert op not in OPS or op in text.split("## Planned", 1)[0], op


def _declaring(make_dist, **versions: str) -> Registry:
    for name, version in versions.items():
        make_dist(name, gemm_only_plugin(name, spec_version=repr(version)))
    return Registry()


def _bumped(major: int = 0, minor: int = 0, patch: int = 0) -> str:
    ma, mi, pa = _parts(SPEC_VERSION)
    if major:
        return f"{ma + major}.0.0"
    if minor:
        return f"{ma}.{mi + minor}.0"
    return f"{ma}.{mi}.{pa + patch}"


def test_other_major_is_refused_naming_both_versions(make_dist):
    newer = _bumped(major=1)
    registry = _declaring(make_dist, nextmajor=newer)
    with pytest.raises(BackendIncompatible) as info:
        registry.load("nextmajor")
    assert newer in str(info.value) and SPEC_VERSION in str(info.value)
    assert registry.backends["nextmajor"].status == "incompatible"


def test_other_minor_loads_with_a_warning_and_patch_is_ignored(make_dist):
    registry = _declaring(make_dist, nextminor=_bumped(minor=1), nextpatch=_bumped(patch=1))
    with pytest.warns(UserWarning, match=re.escape(_bumped(minor=1))):
        ops = registry.load("nextminor")
    assert ops.explain()["gemm"].origin == "backend"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        registry.load("nextpatch")


@pytest.mark.parametrize("declared", ["", "1", "v1.0.0", "one.two.three", None])
def test_missing_or_garbled_version_is_refused(make_dist, declared):
    make_dist("garbled", gemm_only_plugin("garbled", spec_version=repr(declared)))
    with pytest.raises(BackendIncompatible, match="spec_version"):
        Registry().load("garbled")
