"""No import circle inside ``cfm_plugins``, counting every import: at module level, inside
functions and under ``TYPE_CHECKING``.

A function-level import hides a circle from Python until the function runs (and then only when
the other module was half-initialised), so the circle is found here from the source: every
``import`` statement of every module is an edge to the module it names, and any strongly connected
set of more than one module fails the test with its edges. ``make lint`` checks the same and more
with import-linter (``[tool.importlinter]`` in pyproject.toml); this test keeps the guarantee in
``make test``, where import-linter may not be installed. The last tests keep module docstrings
short (what a module does and how to use it).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` under ``root``, by dotted name (a package by its own name)."""
    mods = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def imported_names(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement may import (``from a import b``: ``a.b`` and ``a``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:  # relative: from the package of this module, ``level - 1`` packages up
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    return [f"{source}.{alias.name}" for alias in node.names] + [source]


def import_graph(root: Path, package: str) -> dict[str, dict[str, int]]:
    """``{module: {imported module of the package: first line}}`` over every import statement."""
    mods = module_files(root, package)

    def resolve(name: str) -> str | None:  # the longest prefix that is a module of the package
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, int]] = {m: {} for m in mods}
    for module, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):  # every statement, at any depth
            for name in imported_names(node, module, path.name == "__init__.py"):
                target = resolve(name)
                # importing a module runs its parent packages first: an edge to one's own
                # package is no circle
                if target and target != module and not module.startswith(target + "."):
                    graph[module].setdefault(target, node.lineno)
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, edges = work[-1]
            for w in edges:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
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
    return found


def describe(graph: dict[str, dict[str, int]], cycles: list[list[str]]) -> str:
    lines = []
    for component in cycles:
        lines.append("circle: " + ", ".join(component))
        members = set(component)
        for a in component:
            lines += [f"  {a} -> {b} (line {n})" for b, n in graph[a].items() if b in members]
    return "\n".join(lines)


def test_no_import_circle_in_cfm_plugins():
    graph = import_graph(ROOT, "cfm_plugins")
    assert len(graph) > 50 and any(graph.values())  # the package was read
    cycles = import_cycles(graph)
    assert not cycles, (
        "import circles in cfm_plugins (move what both sides need into a leaf module, or move the "
        "import to the side that owns it):\n" + describe(graph, cycles)
    )


def test_the_check_sees_imports_inside_functions_and_type_checking(tmp_path):
    """The checker itself: a circle closed only by a function-level import, one closed only
    under ``TYPE_CHECKING`` and a relative one are all found; imports of one's own package and
    of outside modules are not circles."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from pkg import a\n",
        "a.py": "import os\nfrom pkg import b\n",
        "b.py": "def later():\n    from pkg.a import x\n    return x\n",
        "c.py": "import typing\nif typing.TYPE_CHECKING:\n    from pkg.sub.d import D\n",
        "sub/__init__.py": "",
        "sub/d.py": "from ..c import C\nfrom . import e\nimport pkg\n",
        "sub/e.py": "from pkg.sub import d\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.b"] == {"pkg.a": 2} and graph["pkg.sub.d"] == {"pkg.c": 1, "pkg.sub.e": 2}
    assert sorted(import_cycles(graph)) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.sub.d", "pkg.sub.e"]]
    assert "pkg.b -> pkg.a (line 2)" in describe(graph, import_cycles(graph))


#: the most lines a module docstring may have (the package, the adapters, the benchmarks, tools,
#: tests and examples): what the module does and how to use it (rationale users need is in docs/,
#: design detail in the docstrings of the classes and functions it explains)
MODULE_DOCSTRING_LINES = 15
#: where the Python lives: folders, and files at the top
PYTHON_PLACES = ("cfm_plugins", "adapters", "benchmarks", "tools", "tests", "examples", "setup.py")


def long_module_docstrings(root: Path, folders=PYTHON_PLACES) -> list[str]:
    """``path: N lines`` for every module in ``folders`` (a folder's ``*.py`` files, or one file)
    whose docstring (first to last non-empty line) is longer than :data:`MODULE_DOCSTRING_LINES`."""
    found = []
    for folder in folders:
        paths = [root / folder] if folder.endswith(".py") else sorted((root / folder).rglob("*.py"))
        for path in paths:
            doc = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
            lines = len(doc.strip("\n").splitlines())
            if lines > MODULE_DOCSTRING_LINES:
                found.append(f"{path.relative_to(root)}: {lines} lines")
    return found


def test_module_docstrings_are_short():
    assert long_module_docstrings(ROOT) == []


def test_the_docstring_check_counts_from_the_first_to_the_last_line(tmp_path):
    (tmp_path / "cfm_plugins").mkdir()
    body = "\n".join(f"line {k}" for k in range(MODULE_DOCSTRING_LINES))
    (tmp_path / "cfm_plugins" / "ok.py").write_text(f'"""\n{body}\n"""\n')
    (tmp_path / "cfm_plugins" / "long.py").write_text(f'"""{body}\none more\n"""\nx = 1\n')
    assert long_module_docstrings(tmp_path, ("cfm_plugins",)) == [
        f"cfm_plugins/long.py: {MODULE_DOCSTRING_LINES + 1} lines"
    ]
