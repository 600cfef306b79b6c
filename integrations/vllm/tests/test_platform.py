"""The platform plugin: opt-in, device facts from the hetero backend, and an engine run on ``HeteroCpuPlatform``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from _compare import DENSE_ROUTES, assert_routed, assert_same_generation

from hetero_vllm import platform


def test_not_requested_activates_nothing(monkeypatch):
    monkeypatch.delenv(platform.PLATFORM_ENV, raising=False)
    assert platform.activate() is None


def test_cpu_backend_activates_the_cpu_subclass(monkeypatch):
    monkeypatch.setenv(platform.PLATFORM_ENV, "1")
    monkeypatch.setenv("HETERO_BACKEND", "cpu_ref")
    assert platform.activate() == platform.CPU_PLATFORM


def test_unknown_backend_keeps_vllms_platform(monkeypatch, caplog):
    monkeypatch.setenv(platform.PLATFORM_ENV, "1")
    monkeypatch.setenv("HETERO_BACKEND", "no_such_backend")
    assert platform.activate() is None
    assert "no hetero platform" in caplog.text and "no_such_backend" in caplog.text


def test_backend_facts_come_from_the_hetero_backend():
    import hetero

    facts = platform.backend_facts("cpu_ref")
    backend = hetero.load("cpu_ref").backend
    assert (facts.backend, facts.device_type, facts.dist_backend) == ("cpu_ref", "cpu", type(backend).dist_backend)


def test_cpu_memory_is_the_machines():
    free, total = platform.device_memory("cpu")
    assert total == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 0 < free <= total


def test_engine_on_the_hetero_platform_matches_stock(models, runs):
    """HETERO_VLLM_PLATFORM=1 alone: vLLM runs on HeteroCpuPlatform, which picks hetero attention and turns the
    routing on; the backend comes from additional_config (no HETERO_BACKEND in the environment)."""
    stock, _ = runs(models["qwen3"])
    got, report = runs(models["qwen3"], backend="cpu_ref", platform=True)
    assert_same_generation(got, stock)
    assert report["driver_platform"] == platform.CPU_PLATFORM
    assert report["platform"] == platform.CPU_PLATFORM
    assert_routed(report, DENSE_ROUTES)


@pytest.mark.parametrize("target, expected", [("", platform.CPU_PLATFORM), ("cpu", "vllm.platforms.cpu.CpuPlatform")])
def test_vllm_resolves_the_platform_unless_the_target_is_cpu(target, expected):
    """vLLM picks the hetero platform over its own CPU one, except that VLLM_TARGET_DEVICE=cpu skips every plugin."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HETERO_", "VLLM_"))}
    env.update(HETERO_VLLM_PLATFORM="1", HETERO_BACKEND="cpu_ref", **({"VLLM_TARGET_DEVICE": target} if target else {}))
    code = "from vllm.platforms import resolve_current_platform_cls_qualname as r; print(r())"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == expected
