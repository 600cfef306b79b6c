"""Fixtures for the hetero-vllm tests: tiny checkpoints and engine runs in subprocesses.

Each engine run is ``_driver.py`` in a fresh process, because vLLM loads general
plugins once per process and hetero-vllm's registrations are process-wide: the
stock reference and the hetero run must not share one. Runs and checkpoints are cached per session, on
disk under a file lock, so that pytest-xdist workers (``make test-vllm`` runs two: an engine run keeps
about one core busy) share them: the first worker to need one makes it, the others wait for it and read it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
from filelock import FileLock

pytest.importorskip("vllm", reason="hetero-vllm tests need vLLM (make test-vllm builds .venv-vllm)")

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "_driver.py"
sys.path.insert(0, str(HERE))

_ROUTING_ENV = (
    "HETERO_VLLM",
    "HETERO_BACKEND",
    "HETERO_VLLM_PLATFORM",
    "HETERO_VLLM_REPORT",
    "HETERO_TRITON_INTERPRET",
    "VLLM_PLUGINS",
    "VLLM_TARGET_DEVICE",
)


class Runs:
    """Runs ``_driver.py`` on a model, stock or through hetero, and caches the results by their settings."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cache: dict[str, tuple[list[dict[str, Any]], dict[str, Any] | None]] = {}

    def __call__(
        self,
        model: Path,
        *,
        backend: str | None = None,
        compiled: bool = False,
        multiprocess: bool = False,
        platform: bool = False,
        env: dict[str, str] | None = None,
        dtype: str = "float32",
    ):
        """(sequences, routing report or None for a stock run).

        ``platform``: through hetero's platform plugin alone (``HETERO_VLLM_PLATFORM=1``,
        neither ``HETERO_VLLM`` nor ``HETERO_BACKEND``), the backend given as vLLM's
        ``additional_config``. The report gains ``driver_platform``, the platform class in use.
        """
        extra = {**(env or {}), **({"dtype": dtype} if dtype != "float32" else {})}
        settings = (backend, compiled, multiprocess, platform, extra)
        tag = self._tag(model, *settings)
        if tag not in self.cache:
            self.cache[tag] = self._shared(tag, model, *settings)
        return self.cache[tag]

    def _shared(self, tag: str, model: Path, *settings: Any):
        """The run of these settings that another worker of this session made, else made here, under a lock."""
        done = self.root / f"{tag}.result.json"
        with FileLock(str(self.root / f"{tag}.lock")):
            if not done.exists():
                done.write_text(json.dumps(self._run(tag, model, *settings)))
        return tuple(json.loads(done.read_text()))

    @staticmethod
    def _tag(model: Path, backend, compiled, multiprocess, platform, extra) -> str:
        return (
            f"{model.name}-{backend or 'stock'}{'-platform' if platform else ''}-"
            f"{'compiled' if compiled else 'eager'}-{'mp' if multiprocess else 'inproc'}"
            + "".join(f"-{k}={v}" for k, v in sorted(extra.items())).replace("/", "_")
        )

    def _run(
        self,
        tag: str,
        model: Path,
        backend: str | None,
        compiled: bool,
        multiprocess: bool,
        platform: bool,
        extra: dict[str, str],
    ):
        out, report = self.root / f"{tag}.json", self.root / f"{tag}.report.json"
        report.unlink(missing_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in _ROUTING_ENV}
        # one KV split in vLLM's CPU attention: its split-KV partitioning follows the thread count, a source of
        # run-to-run differences in the stock reference on a shared machine
        env.update(
            VLLM_CPU_KVCACHE_SPACE="1",
            VLLM_ENABLE_V1_MULTIPROCESSING="1" if multiprocess else "0",
            VLLM_CPU_ATTN_SPLIT_KV="0",
        )
        cmd = [sys.executable, str(DRIVER), str(model), str(out)] + (["--compiled"] if compiled else [])
        if backend is not None and platform:
            env.update(HETERO_VLLM_PLATFORM="1", HETERO_VLLM_REPORT=str(report))
            cmd += ["--hetero-backend", backend]
        elif backend is not None:
            env.update(HETERO_VLLM="1", HETERO_BACKEND=backend, HETERO_VLLM_REPORT=str(report))
        extra = dict(extra)
        if "dtype" in extra:
            cmd += ["--dtype", extra.pop("dtype")]
        env.update(extra)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            pytest.fail(f"{tag}: engine run failed (rc {proc.returncode}):\n{proc.stderr[-6000:]}")
        result = json.loads(out.read_text())
        if backend is None:
            return result["sequences"], None
        routing = json.loads(report.read_text())
        routing["driver_pid"] = result["pid"]  # which writer was the front-end process
        routing["driver_platform"] = result["platform"]
        routing["driver_compilation"] = result["compilation"]  # "NONE" when vLLM ran eagerly
        return result["sequences"], routing


def _session_dir(tmp_path_factory, name: str) -> Path:
    """A directory of this pytest session that every xdist worker of it shares (the workers' base temp
    directories are siblings); without xdist, one of this process."""
    base = tmp_path_factory.getbasetemp()
    path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    path.mkdir(exist_ok=True)
    return path


def _checkpoint(root: Path, write: Callable[[Path], Path]) -> Path:
    path = root / write.__name__.removeprefix("write_")
    with FileLock(str(path) + ".lock"):
        if not (path / "config.json").exists():
            write(path)
    return path


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    """Tiny random float32 checkpoints by name (``_models.WRITERS``), each written on first use."""
    import _models

    root = _session_dir(tmp_path_factory, "models")
    return _Models(root, _models.WRITERS)


class _Models(dict):
    """{name: checkpoint dir}, written lazily: a test that needs one model does not pay for the others."""

    def __init__(self, root: Path, writers) -> None:
        super().__init__()
        self.root, self.writers = root, {w.__name__.removeprefix("write_"): w for w in writers}

    def __missing__(self, name: str) -> Path:
        self[name] = _checkpoint(self.root, self.writers[name])
        return self[name]


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> Runs:
    return Runs(_session_dir(tmp_path_factory, "runs"))


@pytest.fixture
def cpu_ref(monkeypatch):
    """hetero-vllm in this process on cpu_ref, with a fresh op table and report (yielded)."""
    from hetero_vllm import _backend, report

    monkeypatch.setenv("HETERO_BACKEND", "cpu_ref")
    _backend._tables.clear()
    report.reset()
    yield report
    _backend._tables.clear()
    report.reset()
