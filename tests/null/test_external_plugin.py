"""A plugin package written outside this repo, installed by pip, seen by a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from plugin_sources import BROKEN_ON_IMPORT, gemm_only_plugin

BIN = Path(sys.executable).parent


def _package(root: Path, dist: str, pkg: str, ep: str, source: str) -> Path:
    src = root / dist
    (src / pkg).mkdir(parents=True)
    (src / pkg / "__init__.py").write_text("")
    (src / pkg / "plugin.py").write_text(textwrap.dedent(source))
    (src / "pyproject.toml").write_text(
        textwrap.dedent(f"""
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{dist}"
        version = "2.0.0"
        dependencies = []

        [project.entry-points."hetero.backends"]
        {ep} = "{pkg}.plugin"

        [tool.setuptools]
        packages = ["{pkg}"]
    """)
    )
    return src


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """pip-installs two plugin packages (one working, one broken) into a target directory."""
    root = tmp_path_factory.mktemp("external")
    target = root / "site"
    for dist, pkg, ep, source in [
        ("hetero-mychip", "hetero_mychip", "mychip", gemm_only_plugin()),
        ("hetero-badchip", "hetero_badchip", "badchip", BROKEN_ON_IMPORT),
    ]:
        src = _package(root, dist, pkg, ep, source)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--no-build-isolation",
                "--disable-pip-version-check",
                "--target",
                str(target),
                str(src),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
    env = {**os.environ, "PYTHONPATH": str(target)}
    env.pop("HETERO_BACKEND", None)
    return env


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)


def test_cli_lists_the_installed_plugin_and_the_broken_one(installed):
    res = _run([str(BIN / "hetero"), "backends", "--json"], installed)
    assert res.returncode == 0, res.stderr
    rows = {r["name"]: r for r in json.loads(res.stdout)["backends"]}
    mychip = rows["mychip"]
    assert mychip["status"] == "available" and mychip["package"] == "hetero-mychip" and mychip["version"] == "2.0.0"
    assert mychip["native_ops"] == ["gemm"] and "rms_norm" in mychip["fallback_ops"]
    assert rows["badchip"]["status"] == "broken" and "libvendor.so not found" in rows["badchip"]["reason"]
    assert rows["cpu_ref"]["status"] == "available"


def test_load_and_explain_in_a_fresh_process(installed):
    code = (
        "import hetero, torch; ops = hetero.load('mychip'); "
        "print(ops.gemm(torch.ones(2, 3), torch.ones(4, 3)).sum().item())"
    )
    res = _run([sys.executable, "-c", code], installed)
    assert res.returncode == 0 and res.stdout.strip() == "24.0", res.stderr
    res = _run([str(BIN / "hetero"), "explain", "mychip", "--json"], installed)
    ops = {o["op"]: o for o in json.loads(res.stdout)["ops"]}
    assert ops["gemm"]["origin"] == "backend"
    assert all(o["origin"] == "fallback" for name, o in ops.items() if name != "gemm")


def test_auto_selection_prefers_the_plugin(installed):
    res = _run([sys.executable, "-c", "import hetero; print(hetero.load().name)"], installed)
    assert res.stdout.strip() == "mychip", res.stderr
