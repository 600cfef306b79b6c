"""The shape of the source tree: no import cycle, no overlong file, no import of the conformance suite by hetero.

Both checks cover the packages ``hetero`` (``hetero/``) and ``hetero_conformance``
(``conformance/hetero_conformance/``), read with ``ast`` (nothing is imported).

Which imports count as an edge of the import graph:

* only statements that run when the module is imported: at module level, including
  inside module-level ``if``/``try``/``with`` blocks, but not inside a function or a
  class body, and not under ``if TYPE_CHECKING:`` (those never run: such a block is
  the usual way to name a type without importing its module, so counting it would
  flag what is not a cycle at run time);
* ``import a.b.c`` is an edge to ``a.b.c``; ``from a.b import c`` is an edge to
  ``a.b.c`` when that is a module of the tree, else to ``a.b`` (``c`` is a name
  defined there); relative imports are resolved against the importing package;
* the implicit import of a module's parent packages is not an edge: every submodule
  of ``hetero`` would otherwise depend on ``hetero/__init__.py``, which imports them;
* imports of modules outside the two packages are ignored.

Inside ``hetero`` a second check counts every import, at any level (functions, classes,
TYPE_CHECKING blocks): no cycle there either.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: package name -> the directory holding it
PACKAGES = {"hetero": ROOT / "hetero", "hetero_conformance": ROOT / "conformance" / "hetero_conformance"}
MAX_LINES = 300


def modules(packages: dict[str, Path]) -> dict[str, Path]:
    """Every module of ``packages`` by dotted name (a package by its own name, for its ``__init__.py``)."""
    found = {}
    for name, root in packages.items():
        for path in sorted(root.rglob("*.py")):
            parts = [name, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(body: list[ast.stmt]):
    """The import statements of ``body`` that run on import: nested blocks yes, functions, classes and
    TYPE_CHECKING no."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _runtime_imports(node.body)
            yield from _runtime_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _runtime_imports(block)
        elif isinstance(node, (ast.With, ast.For, ast.While)):
            yield from _runtime_imports(node.body)


def _base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` reads from."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def _all_imports(tree: ast.Module):
    """Every import statement of ``tree``: at module level, in functions and classes, under TYPE_CHECKING."""
    return (node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)))


def imports_of(module: str, path: Path, known: set[str], *, anywhere: bool = False) -> set[str]:
    """The modules of ``known`` that ``module`` (at ``path``) imports when it is imported
    (``anywhere``: or in any function, class or TYPE_CHECKING block of it)."""
    tree = ast.parse(path.read_text(), str(path))
    edges = set()
    for node in _all_imports(tree) if anywhere else _runtime_imports(tree.body):
        if isinstance(node, ast.Import):
            edges.update(alias.name for alias in node.names)
            continue
        base = _base(module, path.name == "__init__.py", node)
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            edges.add(sub if sub in known else base)
    return (edges & known) - {module}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted; a cycle lies in each."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def import_graph(packages: dict[str, Path], *, anywhere: bool = False) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` it imports at module level (``anywhere``: at any level)."""
    found = modules(packages)
    return {name: imports_of(name, path, set(found), anywhere=anywhere) for name, path in found.items()}


def long_files(packages: dict[str, Path], limit: int = MAX_LINES) -> dict[str, int]:
    """The ``.py`` files of ``packages`` over ``limit`` lines, relative to the repository, with their length."""
    counts = {path: len(path.read_text().splitlines()) for path in modules(packages).values()}
    return {str(p.relative_to(ROOT)): n for p, n in counts.items() if n > limit}


def test_no_module_level_import_cycle():
    found = cycles(import_graph(PACKAGES))
    assert not found, f"module-level import cycles: {found}"


def test_no_import_cycle_in_hetero_at_any_level():
    """Function-level and TYPE_CHECKING imports count too: a cycle hidden in a function is still two
    modules that cannot be understood, tested or moved apart."""
    found = cycles(import_graph({"hetero": PACKAGES["hetero"]}, anywhere=True))
    assert not found, f"import cycles (imports at any level counted): {found}"


def _names_conformance(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[0] == "hetero_conformance" for a in node.names)
    if isinstance(node, ast.ImportFrom):
        return not node.level and (node.module or "").split(".")[0] == "hetero_conformance"
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        arg = node.args[0].value
        return (
            fn in ("import_module", "__import__") and isinstance(arg, str) and arg.split(".")[0] == "hetero_conformance"
        )
    return False


def conformance_imports(root: Path) -> list[str]:
    """``file:line`` of every import of hetero_conformance under ``root``, at any level (importlib included)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        found += [f"{path.relative_to(root.parent)}:{n.lineno}" for n in ast.walk(tree) if _names_conformance(n)]
    return found


def test_hetero_never_imports_hetero_conformance():
    """hetero works without the conformance suite (``pip install hetero`` alone runs check-model --per-op,
    bench and profile); the suite adds its commands through the ``hetero.commands`` entry points."""
    found = conformance_imports(PACKAGES["hetero"])
    assert not found, f"hetero imports hetero_conformance: {found}"


@pytest.mark.parametrize(
    "source, found",
    [
        ("import hetero_conformance\n", True),
        ("def f():\n    from hetero_conformance.runner import call\n", True),
        ("import importlib\nimportlib.import_module('hetero_conformance.cli')\n", True),
        ("from hetero.verify import judge\nTEXT = 'from hetero_conformance import x'\n", False),
    ],
)
def test_the_conformance_import_finder(tmp_path, source, found):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(source)
    assert bool(conformance_imports(tmp_path / "pkg")) == found


def test_no_file_over_300_lines():
    found = long_files(PACKAGES)
    assert not found, f"files over {MAX_LINES} lines (split them by responsibility): {found}"


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from pkg import VERSION\n", [["pkg", "pkg.a"]]),  # a name of the package namespace: an edge to pkg
        ("from pkg import b\n", []),  # the submodule b, not the package
        ("from pkg.b import thing\n", []),
        ("from . import b\n", []),
        ("from . import VERSION\n", [["pkg", "pkg.a"]]),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import thing\n", []),
        ("def f():\n    from pkg import thing\n", []),
        ("try:\n    import pkg\nexcept ImportError:\n    pass\n", [["pkg", "pkg.a"]]),
    ],
)
def test_the_cycle_finder(tmp_path, source, expected):
    """A planted package: ``pkg/__init__`` imports ``pkg.a``; ``a``'s source decides whether there is a cycle."""
    (tmp_path / "__init__.py").write_text("from pkg.a import thing\n")
    (tmp_path / "a.py").write_text(source + "thing = 1\n")
    (tmp_path / "b.py").write_text("")
    assert cycles(import_graph({"pkg": tmp_path})) == expected


@pytest.mark.parametrize(
    "source",
    [
        "def f():\n    from pkg import thing\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import thing\n",
        "class C:\n    def m(self):\n        import pkg\n",
    ],
)
def test_the_cycle_finder_at_any_level(tmp_path, source):
    (tmp_path / "__init__.py").write_text("from pkg.a import thing\n")
    (tmp_path / "a.py").write_text(source + "thing = 1\n")
    assert cycles(import_graph({"pkg": tmp_path})) == []
    assert cycles(import_graph({"pkg": tmp_path}, anywhere=True)) == [["pkg", "pkg.a"]]


def test_importing_plugins_engine_and_conformance_loads_no_triton_kernel_module():
    """The @triton.jit modules load lazily, after the process chose the interpreter or a device: a
    kernel module imported earlier (by a plugin, the engine or the case catalog, at collection time)
    keeps compiled-mode helpers, and every interpreted kernel calling them fails ("Cannot call
    @triton.jit'd outside of the scope of a kernel")."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import hetero_ascend.plugin, hetero_cuda.plugin, hetero_rocm.plugin, hetero_cpu_ref.plugin\n"
        "import hetero.engine, hetero.engine.quant, hetero_conformance.cases, hetero.bench.model\n"
        "print(sorted(m for m in sys.modules if m.startswith('hetero.kernels.') and m.endswith('_kernels')"
        " or m.startswith('hetero.kernels.') and m.rsplit('.', 1)[1] in ('attention', 'gemm', 'moe', 'dsa')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
