"""`hetero new-backend NAME`: the generated plugin installs, loads, falls back everywhere, and its
first op, once implemented, is judged by the conformance suite (pass when right, fail when wrong)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hetero
from hetero.cli import main
from hetero.spec import OP_NAMES

BIN = Path(sys.executable).parent
HETERO = str(BIN / "hetero")


def _run(args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def _install(src: Path, target: Path) -> dict[str, str]:
    """pip-installs the generated package into its own target directory; the env that sees it."""
    res = _run(
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
        ]
    )
    assert res.returncode == 0, res.stderr
    env = {**os.environ, "PYTHONPATH": str(target)}
    for var in ("HETERO_BACKEND", "HETERO_PLUGINS", "HETERO_DISABLE_PLUGINS", "HETERO_TRITON_INTERPRET"):
        env.pop(var, None)
    return env


def _statuses(env: dict[str, str], report: Path, *extra: str) -> tuple[int, dict[str, str], str]:
    res = _run([HETERO, "conformance", "mychip", "--quick", "--json", str(report), *extra], env)
    cases = json.loads(report.read_text())["cases"] if report.exists() else []
    return res.returncode, {c["id"]: c["status"] for c in cases}, res.stdout + res.stderr


def _implement_silu_and_mul(plugin: Path, *, swapped: bool = False) -> None:
    """Uncomment the example op of the generated plugin (optionally with its halves swapped)."""
    text = plugin.read_text()
    start = text.index("    # def silu_and_mul(")
    block = text[start:].split("\n\n")[0]
    code = "\n".join(line.replace("    # ", "    ", 1) for line in block.splitlines())
    if swapped:
        assert "gate, up = " in code
        code = code.replace("gate, up = ", "up, gate = ")
    plugin.write_text(text.replace(block, code))


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("scaffold")
    res = _run([HETERO, "new-backend", "mychip"], cwd=root)
    assert res.returncode == 0, res.stderr
    return root


def test_layout_entry_point_and_spec_version(generated):
    pkg = generated / "hetero-mychip"
    pyproject = (pkg / "pyproject.toml").read_text()
    assert '[project.entry-points."hetero.backends"]\nmychip = "hetero_mychip.plugin"' in pyproject
    assert 'dependencies = ["hetero", "torch"]' in pyproject
    plugin = (pkg / "hetero_mychip" / "plugin.py").read_text()
    assert f'spec_version = "{hetero.SPEC_VERSION}"' in plugin and 'device_type = "cpu"' in plugin
    assert "    # def silu_and_mul(" in plugin and "\n    def silu_and_mul(" not in plugin
    readme = (pkg / "README.md").read_text()
    for needle in (
        "hetero explain mychip",
        "hetero conformance mychip --quick",
        "hetero/spec/",
        "hetero_op_overrides",
        "jobs:",
    ):
        assert needle in readme
    for rel in ("hetero_mychip/__init__.py", "hetero_mychip/plugin.py", "tests/test_conformance.py"):
        compile((pkg / rel).read_text(), rel, "exec")


@pytest.mark.parametrize("name", ["MyChip", "my-chip", "1chip", "", "my chip", "chip!"])
def test_invalid_names_are_usage_errors(name, tmp_path, capsys):
    assert main(["new-backend", name, "--dir", str(tmp_path)]) == 2
    assert "invalid backend name" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_refuses_to_overwrite(tmp_path, capsys):
    assert main(["new-backend", "chip2", "--dir", str(tmp_path)]) == 0
    (tmp_path / "hetero-chip2" / "pyproject.toml").write_text("mine")
    capsys.readouterr()
    assert main(["new-backend", "chip2", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str((tmp_path / "hetero-chip2").resolve()) in err and "already exists" in err
    assert (tmp_path / "hetero-chip2" / "pyproject.toml").read_text() == "mine"


def test_generated_as_is_every_op_is_fallback(generated, tmp_path):
    env = _install(generated / "hetero-mychip", tmp_path / "site")
    res = _run([HETERO, "explain", "mychip", "--json"], env)
    assert res.returncode == 0, res.stderr
    assert {o["op"]: o["origin"] for o in json.loads(res.stdout)["ops"]} == dict.fromkeys(OP_NAMES, "fallback")
    rc, statuses, out = _statuses(env, tmp_path / "report.json")
    assert rc == 0, out
    assert statuses and set(statuses.values()) == {"fallback"}
    # ep_dispatch/ep_combine are collectives: single-process conformance has no case for them
    # (multi-process: --world-size)
    assert {case.split("/")[0] for case in statuses} == set(OP_NAMES) - {"ep_dispatch", "ep_combine"}


@pytest.mark.parametrize("swapped", [False, True], ids=["right", "swapped-halves"])
def test_implementing_silu_and_mul(generated, tmp_path, swapped):
    pkg = tmp_path / "hetero-mychip"
    _run(["cp", "-r", str(generated / "hetero-mychip"), str(pkg)])
    _implement_silu_and_mul(pkg / "hetero_mychip" / "plugin.py", swapped=swapped)
    env = _install(pkg, tmp_path / "site")
    rc, statuses, out = _statuses(env, tmp_path / "report.json", "--ops", "silu_and_mul,rms_norm")
    silu = {s for case, s in statuses.items() if case.startswith("silu_and_mul/")}
    assert silu and {s for case, s in statuses.items() if case.startswith("rms_norm/")} == {"fallback"}
    if swapped:
        assert rc == 1 and silu == {"fail"}, out
    else:
        assert rc == 0 and silu == {"pass"}, out
    # the generated CI test says the same
    res = _run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        {**env, "HETERO_CONFORMANCE_OPS": "silu_and_mul,rms_norm"},
        cwd=pkg,
    )
    assert res.returncode == (1 if swapped else 0), res.stdout + res.stderr
    if swapped:
        assert "silu_and_mul/" in res.stdout


def test_triton_variant_is_native_everywhere(tmp_path):
    assert _run([HETERO, "new-backend", "mychip", "--triton", "--dir", str(tmp_path)]).returncode == 0
    pkg = tmp_path / "hetero-mychip"
    plugin = (pkg / "hetero_mychip" / "plugin.py").read_text()
    assert "class MychipBackend(TritonBackend)" in plugin and f'spec_version = "{hetero.SPEC_VERSION}"' in plugin
    assert "tuning table" in (pkg / "README.md").read_text().lower()
    env = _install(pkg, tmp_path / "site")
    res = _run([HETERO, "explain", "mychip", "--json"], env)
    assert json.loads(res.stdout)["status"] == "unavailable"  # device_type "cpu" until the author sets it
    res = _run([HETERO, "explain", "mychip", "--json"], {**env, "HETERO_TRITON_INTERPRET": "1"})
    report = json.loads(res.stdout)
    assert res.returncode == 0 and report["status"] == "available", res.stderr
    assert {o["op"]: o["origin"] for o in report["ops"]} == dict.fromkeys(OP_NAMES, "backend")
