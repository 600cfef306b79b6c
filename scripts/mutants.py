"""Mutation check: plant each curated bug of scripts/mutants.toml in a copy of the tree, run its tests.

    python scripts/mutants.py [--only ID[,ID]] [--list] [-j N] [--timeout S] [--report PATH]

A mutant is *caught* when its tests fail, *survived* when they pass, and *error* when it
does not apply (its original text is not in its file exactly once), its tests cannot run
(pytest exit 3-5), they time out, or they fail on the unmutated tree too.

Each mutant runs only its own ``tests`` (those of its package, the catching one first, with -x), and
only once the unmutated tree has passed them. The union of the selected mutants' tests runs first,
in one pytest call: when it passes, every mutant's tests are proven. When it fails, each test path
is proven apart, once per run, the first time a mutant lists it (a node id is covered by its proven
file), and every later mutant listing it reuses that result: a failing baseline would make every
mutant of it look caught, so those mutants are errors and the run exits 2, while the mutants of
the packages whose tests pass still run.

Each run works in a temporary copy of one snapshot of the working tree, taken at the start
(tracked files plus untracked ones git does not ignore, so tests not yet committed count), never
in the tree itself, so edits others make meanwhile reach neither the baseline nor a mutant. The copy's
packages shadow the editable installs through PYTHONPATH, which every subprocess the tests
start (torchrun ranks, conformance isolate workers, spawn) inherits; the first copy checks
that. A full run (no --only) writes docs/mutants.md. Exit 1 if a mutant survived or errored.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
LIST = ROOT / "scripts" / "mutants.toml"
REPORT = ROOT / "docs" / "mutants.md"
#: where each package lives in the tree, in the order PYTHONPATH lists them
PACKAGE_DIRS = {
    ".": "hetero",
    "backends/cpu_ref": "hetero_cpu_ref",
    "conformance": "hetero_conformance",
    "backends/cuda": "hetero_cuda",
    "backends/rocm": "hetero_rocm",
    "backends/ascend": "hetero_ascend",
    "backends/torch": "hetero_torch",
}
FIELDS = ("id", "area", "file", "original", "replacement", "description", "tests")


@dataclass
class Result:
    id: str
    status: str  # caught | survived | error
    seconds: float
    detail: str = ""  # the failing test (caught) or why (error)


def load(path: Path = LIST) -> list[dict]:
    with open(path, "rb") as f:
        return tomllib.load(f)["mutant"]


def file_of(path: str) -> str:
    return path.split("::", 1)[0]


def problems(mutants: list[dict], root: Path = ROOT) -> list[str]:
    """Why the list would not apply to the tree at ``root`` (empty when it does)."""
    out, seen = [], set()
    for m in mutants:
        name = m.get("id", "?")
        out += [f"{name}: missing field {f}" for f in FIELDS if f not in m]
        if name in seen:
            out.append(f"{name}: duplicate id")
        seen.add(name)
        if not {"file", "original", "replacement", "tests"} <= set(m):
            continue
        target = root / m["file"]
        count = target.read_text().count(m["original"]) if target.is_file() else -1
        if count != 1:
            out.append(f"{name}: original text occurs {count} times in {m['file']} (-1: no such file)")
        if m["original"] == m["replacement"]:
            out.append(f"{name}: replacement equals original")
        if not m["tests"]:
            out.append(f"{name}: no tests")
        out += [f"{name}: no test {t}" for t in m["tests"] if not (root / file_of(t)).is_file()]
    return out


def union(paths: list[str]) -> list[str]:
    """Distinct paths, node ids dropped when their whole file is already listed."""
    files = {p for p in paths if "::" not in p}
    return [p for p in dict.fromkeys(paths) if p in files or file_of(p) not in files]


def copy_tree(dest: Path) -> None:
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():  # a tracked file deleted in the working tree is skipped
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def env_for(copy: Path) -> dict[str, str]:
    paths = [str(copy / d) if d != "." else str(copy) for d in PACKAGE_DIRS]
    old = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths + ([old] if old else []))}


# run in the copy: the packages, and those a child started the way the tests start theirs, come from it
_PROBE = """
import subprocess, sys
mods = {mods!r}
def where():
    return [__import__(m).__file__ for m in mods]
from hetero_conformance._worker import child_env
child = subprocess.run([sys.executable, "-c", "import sys; print(*[__import__(m).__file__ for m in sys.argv[1:]])", *mods],
                       capture_output=True, text=True, check=True).stdout.split()
isolated = subprocess.run([sys.executable, "-c", "import sys; print(*[__import__(m).__file__ for m in sys.argv[1:]])", *mods],
                          capture_output=True, text=True, check=True, env=child_env()).stdout.split()
print("\\n".join(where() + child + isolated))
"""  # noqa: E501 (the probe program run in the copy, kept as it is)


def check_shadowing(copy: Path) -> None:
    mods = list(PACKAGE_DIRS.values())
    run = subprocess.run(
        [sys.executable, "-c", _PROBE.format(mods=mods)], cwd=copy, env=env_for(copy), capture_output=True, text=True
    )
    found = run.stdout.split()
    escaped = [f for f in found if not Path(f).resolve().is_relative_to(copy.resolve())]
    if run.returncode or len(found) != 3 * len(mods) or escaped:
        sys.exit(f"mutants: the copy does not shadow the installed packages: {escaped or run.stderr[-2000:]}")


def pytest(copy: Path, paths: list[str], timeout: float) -> tuple[int | None, str]:
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *paths]
    try:
        run = subprocess.run(cmd, cwd=copy, env=env_for(copy), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, ""
    return run.returncode, run.stdout + run.stderr


def first_failure(output: str) -> str:
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" ", 1)[1].split(" - ", 1)[0]
    return output.strip().splitlines()[-1] if output.strip() else ""


def run_mutant(m: dict, snapshot: Path, timeout: float) -> Result:
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"mutant-{m['id']}-") as tmp:
        copy = Path(tmp)
        shutil.copytree(snapshot, copy, dirs_exist_ok=True)
        target = copy / m["file"]
        text = target.read_text() if target.is_file() else ""
        if text.count(m["original"]) != 1:
            return Result(m["id"], "error", time.monotonic() - start, "does not apply")
        target.write_text(text.replace(m["original"], m["replacement"]))
        rc, output = pytest(copy, m["tests"], timeout)
    seconds = time.monotonic() - start
    if rc is None:
        return Result(m["id"], "error", seconds, f"timeout after {timeout:g} s")
    if rc == 0:
        return Result(m["id"], "survived", seconds)
    if rc in (1, 2):  # failed tests, or a collection error the mutant caused
        return Result(m["id"], "caught", seconds, first_failure(output))
    return Result(m["id"], "error", seconds, f"pytest exit {rc}: {first_failure(output)}")


class Baselines:
    """The unmutated tree's verdict on each test path, proven at most once per run.

    ``prove_all`` proves every path at once when their union passes. ``prove(paths)`` runs, in one
    pytest call, the paths of the list no earlier call proved or is proving, waits for those another
    thread is proving, and returns None when all passed, else why not. A node id counts as proven by
    its file's run; a file is never covered by one of its nodes.
    """

    def __init__(self, snapshot: Path, timeout: float):
        self.snapshot, self.timeout = snapshot, timeout
        self.runs: list[tuple[list[str], float, str | None]] = []  # (paths, seconds, why not green)
        self._lock = threading.Lock()
        self._proofs: dict[str, Future] = {}

    def prove_all(self, paths: list[str]) -> bool:
        """Run the union of ``paths`` once; when it passes every path is proven (the usual case: one
        pytest start-up instead of one per package). When it fails nothing is proven, so each mutant's
        own paths are proven apart and only the mutants of the failing ones are lost."""
        paths = union(paths)
        if self._run(paths) is not None:
            print("mutants: proving each mutant's tests apart, to find the ones that fail", flush=True)
            return False
        with self._lock:
            proof: Future = Future()
            proof.set_result(None)
            for p in paths:
                self._proofs[p] = proof
        return True

    def _known(self, path: str) -> Future | None:
        return self._proofs.get(path) or self._proofs.get(file_of(path))

    def prove(self, paths: list[str]) -> str | None:
        with self._lock:
            mine = union([p for p in paths if self._known(p) is None])
            proof: Future = Future()
            for p in mine:
                self._proofs[p] = proof
            waits = {id(f): f for f in (self._known(p) for p in paths) if f is not proof}
        if mine:
            proof.set_result(self._run(mine))
        for why in [proof.result() if mine else None, *(f.result() for f in waits.values())]:
            if why is not None:
                return why
        return None

    def _run(self, paths: list[str]) -> str | None:
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="mutant-baseline-") as tmp:
            shutil.copytree(self.snapshot, tmp, dirs_exist_ok=True)
            rc, output = pytest(Path(tmp), paths, self.timeout * 3)
        why = None
        if rc != 0:
            why = "timeout" if rc is None else f"exit {rc}: {first_failure(output)}"
            print(output[-4000:])
            print(f"mutants: the unmutated tree fails {' '.join(paths)} ({why})", flush=True)
        seconds = time.monotonic() - start
        self.runs.append((paths, seconds, why))
        print(f"baseline  {'green' if why is None else 'FAILS':9} {seconds:6.1f} s  {' '.join(paths)}", flush=True)
        return why


def shadowing_checked(snapshot: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="mutant-probe-") as tmp:
        shutil.copytree(snapshot, tmp, dirs_exist_ok=True)
        check_shadowing(Path(tmp))


def tree_state() -> str:
    def git(*a):
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return f"commit {git('rev-parse', '--short', 'HEAD')}" + (
        " plus uncommitted changes" if git("status", "--porcelain") else ""
    )


def package_of(m: dict) -> str:
    """The package a mutant lives in: its file's folder (``hetero/serve/pd``, ``backends/torch/hetero_torch``)."""
    return str(Path(m["file"]).parent)


def package_rows(selected: list[dict], results: dict[str, Result]) -> list[str]:
    """One Markdown row per package: its mutants, and how many were caught."""
    by: dict[str, list[dict]] = {}
    for m in selected:
        by.setdefault(package_of(m), []).append(m)
    rows = []
    for pkg, ms in sorted(by.items()):
        caught = sum(results[m["id"]].status == "caught" for m in ms)
        ids = ", ".join(f"`{m['id']}`" for m in ms)
        rows.append(f"| `{pkg}` | {len(ms)} | {caught} | {ids} |")
    return rows


def write_report(
    path: Path, selected: list[dict], results: dict[str, Result], command: str, wall: float, baseline_s: float = 0.0
) -> None:
    counts = {s: sum(r.status == s for r in results.values()) for s in ("caught", "survived", "error")}
    rows = []
    for m in selected:
        r = results[m["id"]]
        catcher = r.detail if r.status == "caught" else ", ".join(m["tests"])
        result = r.status if r.status != "error" else f"error: {r.detail}"
        rows.append(f"| `{m['id']}` | {m['area']} | {m['description']} | `{catcher}` | {result} |")
    path.write_text(
        "\n".join(
            [
                "# Mutation check",
                "",
                "Curated bugs (`scripts/mutants.toml`) planted one at a time in a temporary copy of the tree;",
                "each must make its tests fail. Regenerate with `make mutants` (this file is its report).",
                "",
                f"- command: `{command}`",
                f"- date: {datetime.now().astimezone().isoformat(timespec='seconds')}, tree: {tree_state()}",
                f"- wall time: {wall / 60:.1f} min ({baseline_s / 60:.1f} min of it proving the unmutated tree green)",
                f"- score: {counts['caught']} caught, {counts['survived']} survived, {counts['error']} error "
                f"of {len(selected)} mutants",
                "",
                "## Per package",
                "",
                "| package | mutants | caught | ids |",
                "|---|---|---|---|",
                *package_rows(selected, results),
                "",
                "## Mutants",
                "",
                "| id | area | description | catching test (or tests run) | result |",
                "|---|---|---|---|---|",
                *rows,
                "",
            ]
        )
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="plant curated bugs in a copy of the tree and check the tests catch them")
    p.add_argument("--only", help="comma-separated mutant ids")
    p.add_argument("--list", action="store_true", help="list the mutants and exit")
    p.add_argument("-j", "--jobs", type=int, default=1, help="mutants run in parallel (default 1)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per mutant's tests (default 600)")
    p.add_argument(
        "--report", type=Path, help=f"write the report here (default: {REPORT.relative_to(ROOT)} on a full run)"
    )
    p.add_argument("--no-baseline", action="store_true", help="skip the unmutated run (only while developing)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    mutants = load()
    if args.list:
        for m in mutants:
            print(f"{m['id']:32} {m['area']:12} {m['description']}")
        return 0
    selected = mutants
    if args.only:
        wanted = args.only.split(",")
        unknown = set(wanted) - {m["id"] for m in mutants}
        if unknown:
            print(f"mutants: unknown ids {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        selected = [m for m in mutants if m["id"] in wanted]
    start = time.monotonic()
    results: dict[str, Result] = {}
    # one snapshot of the shared working tree: the baseline and every mutant see the same files
    with (
        tempfile.TemporaryDirectory(prefix="mutant-snapshot-") as snapshot,
        ThreadPoolExecutor(max(1, args.jobs)) as pool,
    ):
        copy_tree(Path(snapshot))
        shadowing_checked(Path(snapshot))
        baselines = Baselines(Path(snapshot), args.timeout)
        union_green = args.no_baseline or baselines.prove_all([t for m in selected for t in m["tests"]])

        def one(m: dict) -> Result:
            why = None if args.no_baseline else baselines.prove(m["tests"])
            if why is not None:
                return Result(m["id"], "error", 0.0, f"its tests fail on the unmutated tree ({why})")
            return run_mutant(m, Path(snapshot), args.timeout)

        for r in pool.map(one, selected):
            results[r.id] = r
            print(f"{r.status:9} {r.id:32} {r.seconds:6.1f} s  {r.detail}", flush=True)
    wall = time.monotonic() - start
    report = args.report or (None if args.only else REPORT)
    if report is not None:
        command = "python scripts/mutants.py " + " ".join(argv if argv is not None else sys.argv[1:])
        write_report(report, selected, results, command.strip(), wall, sum(r[1] for r in baselines.runs))
    bad = [r.id for r in results.values() if r.status != "caught"]
    print(
        f"{len(selected) - len(bad)} of {len(selected)} caught in {wall / 60:.1f} min"
        + (f"; not caught: {', '.join(bad)}" if bad else "")
    )
    if not union_green and any(r.status == "error" and "unmutated" in r.detail for r in results.values()):
        return 2
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
