"""Fixtures that make real plugin distributions on disk (importlib.metadata finds them on sys.path)."""

from __future__ import annotations

import importlib
import itertools
import json
import os
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

_counter = itertools.count()


def pytest_configure(config):
    """Under pytest-xdist, each worker sees the caller's terminal size and takes its share of the cores.

    Workers at full intra-op width would oversubscribe the machine. OMP/MKL_NUM_THREADS reach the
    subprocesses tests start (CLIs, servers, torchrun ranks); a value set by the caller is kept.
    """
    # compiled engines cache their graphs under HETERO_CACHE_ROOT: a test run starts from an empty one
    os.environ.setdefault("HETERO_CACHE_ROOT", tempfile.mkdtemp(prefix="hetero-test-cache-"))
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        # what the workers see as the terminal: xdist hands them COLUMNS=80 and LINES=24, which rich obeys (hetero's
        # CLI folds its tables to 80 columns when COLUMNS is set); a worker restores this caller's values instead
        os.environ["HETERO_TESTS_TERMINAL"] = json.dumps({k: os.environ.get(k) for k in ("COLUMNS", "LINES")})
        return
    for key, value in json.loads(os.environ.get("HETERO_TESTS_TERMINAL", "{}")).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2 or "OMP_NUM_THREADS" in os.environ:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = max(1, cores // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ.setdefault("MKL_NUM_THREADS", str(threads))
    import torch

    torch.set_num_threads(threads)


#: the longest files (minutes under pytest-xdist on two cores) go to the workers first: dealt out in collection
#: order, one of them started last would run alone at the end while the other workers sit idle
HEAVIEST_FIRST = (
    "kernels/test_backends.py",
    "engine/test_dsa_models.py",
    "backend/test_torch_backend.py",
    "conformance/test_planted_bugs.py",
    "engine/test_end_to_end.py",
    "engine/test_parallel.py",
    "engine/test_finding_bugs_page.py",
    "conformance/test_world_size.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(HEAVIEST_FIRST)}
    here = Path(__file__).parent

    def order(item) -> int:
        try:
            return rank.get(item.path.relative_to(here).as_posix(), len(rank))
        except ValueError:
            return len(rank)

    items.sort(key=order)  # stable: a file's tests keep their order


class DistMaker:
    """Writes `<site>/<pkg>/plugin.py` and `<site>/<dist>-<ver>.dist-info` with a hetero.backends entry point."""

    def __init__(self, site: Path):
        self.site = site
        self.packages: list[str] = []

    def __call__(self, ep_name: str, plugin_source: str, *, version: str = "0.3.1") -> str:
        pkg = f"hetero_testplugin_{ep_name.replace('-', '_')}_{next(_counter)}"
        dist = pkg.replace("_", "-")
        (self.site / pkg).mkdir(parents=True)
        (self.site / pkg / "__init__.py").write_text("")
        (self.site / pkg / "plugin.py").write_text(textwrap.dedent(plugin_source))
        info = self.site / f"{pkg}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[hetero.backends]\n{ep_name} = {pkg}.plugin\n")
        self.packages.append(pkg)
        importlib.invalidate_caches()
        return dist


@pytest.fixture
def make_dist(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    maker = DistMaker(site)
    yield maker
    for pkg in maker.packages:
        for mod in [m for m in sys.modules if m == pkg or m.startswith(pkg + ".")]:
            del sys.modules[mod]
