"""The shape of the code a newcomer reads: no import cycle between ``harness`` packages nor
between the modules inside one, and no module over 400 lines unless its docstring says
why it stays whole.

Read from the source with ``ast`` (every import, the lazy ones inside functions too), so
the test sees what a reader sees, not what happens to be imported at run time.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

HARNESS = Path(__file__).resolve().parent.parent / "harness"
MAX_LINES = 400
#: The words a long module's docstring uses to say why it is one module.
WHOLE = "stays whole"


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(HARNESS.rglob("*.py")):
        parts = path.relative_to(HARNESS.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def _unit(module: str) -> str:
    """The package a module belongs to: ``harness.verdicts`` for
    ``harness.verdicts.gpu_use``; a top-level module (``harness.plugin``) is its own."""
    return ".".join(module.split(".")[:2])


def _imported(module: str, path: Path) -> Iterator[str]:
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                yield ".".join([*base, node.module] if node.module else base)
            elif node.module:
                yield node.module


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in _modules():
        unit = _unit(module)
        graph.setdefault(unit, set())
        for target in _imported(module, path):
            if target == "harness" or not target.startswith("harness."):
                continue
            if _unit(target) != unit:
                graph[unit].add(_unit(target))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_harness_packages() -> None:
    graph = package_graph()
    assert "harness.verdicts" in graph, "the graph was read"
    found = cycles(graph)
    detail = "; ".join(
        " <-> ".join(component) + " (" + ", ".join(
            f"{a} imports {b}" for a in component for b in sorted(graph[a]) if b in component)
        + ")" for component in found)
    assert not found, f"import cycles between packages: {detail}"


def module_graph(package: str) -> dict[str, set[str]]:
    """The imports between the modules of one package (``harness.results``): which of its
    modules each of its modules imports, the lazy imports inside functions too."""
    graph: dict[str, set[str]] = {}
    inside = {module for module, _ in _modules()
              if module.rsplit(".", 1)[0] == package or module == package}
    for module, path in _modules():
        if module not in inside:
            continue
        graph.setdefault(module, set())
        for target in _imported(module, path):
            # `from harness.results import x` names the module harness.results.x.
            owner = next((m for m in (target, target.rsplit(".", 1)[0]) if m in inside), None)
            if owner is not None and owner != module:
                graph[module].add(owner)
    return graph


def _packages() -> list[str]:
    return sorted({module for module, path in _modules() if path.name == "__init__.py"})


def test_the_module_graph_reads_the_imports_inside_a_package() -> None:
    graph = module_graph("harness.results")
    assert "harness.results.store" in graph["harness.results.baseline_selection"], graph


def test_no_import_cycle_between_modules_inside_a_package() -> None:
    found = {package: cycles(module_graph(package)) for package in _packages()}
    found = {package: circles for package, circles in found.items() if circles}
    assert "harness.results" in _packages(), "the packages were read"
    assert not found, f"import circles inside packages: {found}"


def undocumented_long_modules(root: Path = HARNESS) -> list[str]:
    """Modules under ``root`` over MAX_LINES lines whose docstring does not say why."""
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MAX_LINES and WHOLE not in (ast.get_docstring(ast.parse(text)) or ""):
            found.append(f"{path.relative_to(root.parent)} ({lines} lines)")
    return found


def test_the_size_check_finds_a_long_module_without_a_reason(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    body = "x = 1\n" * (MAX_LINES + 1)
    (package / "long.py").write_text('"""Does two jobs."""\n' + body)
    (package / "kept.py").write_text(f'"""One parser; it {WHOLE}: the grammar is one."""\n'
                                     + body)
    (package / "short.py").write_text("x = 1\n")
    assert undocumented_long_modules(package) == [f"pkg/long.py ({MAX_LINES + 2} lines)"]


def test_every_long_module_says_why_it_stays_whole() -> None:
    found = undocumented_long_modules()
    assert not found, (
        f"over {MAX_LINES} lines: split each by job, or say in its docstring why it "
        f"{WHOLE}: " + ", ".join(found))


#: Names two packages share on purpose: one subject seen as facts (the values) and as a
#: probe (gathering them), or as a plan (pure) and as the build that carries it out.
SHARED_NAMES = {"cuda_toolkit.py": {"facts", "probes"}, "device_list.py": {"facts", "probes"},
                "base_image.py": {"planning", "builds"}}


#: A command module is named for the command it defines (``harness --help`` is built from
#: the names), so ``commands/build.py`` may share its name with ``facts/build.py``.
COMMANDS = HARNESS / "commands"


def test_module_names_do_not_repeat_across_packages() -> None:
    homes: dict[str, set[str]] = {}
    for path in HARNESS.rglob("*.py"):
        if path.name != "__init__.py" and path.parent != COMMANDS:
            homes.setdefault(path.name, set()).add(path.parent.name)
    repeated = {name: sorted(where) for name, where in homes.items()
                if len(where) > 1 and SHARED_NAMES.get(name) != where}
    assert not repeated, f"module names in more than one package: {repeated}"
