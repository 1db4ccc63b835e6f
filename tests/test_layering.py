"""The package's import graph is one-way: no import cycles, and the core never imports the adapters.

Read with `ast` only (nothing is imported, no extra dependency). Every `import` statement counts,
including those inside functions and under `if TYPE_CHECKING:`, and `importlib.import_module` /
`__import__` calls with a literal module name: a deferred import is still a dependency, it only
hides the cycle until the first call. `from pkg import name` is an edge to
`pkg.name` when that is a module of ours, else to `pkg` itself.

Layers: `tokenrails/guided/` and `tokenrails/kernels/` (the core) must not import
`tokenrails/engine_patch/` or `tokenrails/compat/` (the adapters and legacy shapes built on it), nor
`tokenrails/requests/` (request parsing sits beside the core: it imports `GuideSpec`, the core never
imports it).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "tokenrails"
CORE = ("tokenrails.guided", "tokenrails.kernels")
ABOVE_CORE = ("tokenrails.engine_patch", "tokenrails.compat", "tokenrails.requests")

ALLOWED_CYCLES: frozenset[frozenset[str]] = frozenset()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def discover_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def _resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str:
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _owning_module(name: str, modules: dict[str, Path]) -> str | None:
    """The most specific module of ours that `name` denotes (a.b.c → a.b.c, else a.b, ...)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _is_import_call(node: ast.AST) -> bool:
    """``importlib.import_module("tokenrails....")`` / ``__import__("...")`` with a literal name."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name in ("import_module", "__import__")


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every tokenrails module `module` imports, at any depth of its code."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (
                _resolve_relative(module, is_package, node.level, node.module)
                if node.level
                else (node.module or "")
            )
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        elif _is_import_call(node):
            names = [node.args[0].value]
        else:
            continue
        for name in names:
            if name == "tokenrails" or name.startswith("tokenrails."):
                owner = _owning_module(name, modules)
                if owner is not None and owner != module:
                    found.add(owner)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = discover_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of more than one module (or a self-loop)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    components.append(sorted(component))
    return components


def one_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A concrete closed path inside `component` (breadth-first, shortest from its first member)."""
    members = set(component)
    start = component[0]
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return list(reversed(path)) + [start]
                if child not in parents:
                    parents[child] = node
                    following.append(child)
        frontier = following
    return component


def describe(graph: dict[str, set[str]], component: list[str]) -> str:
    cycle = " -> ".join(one_cycle(graph, component))
    return f"{len(component)} modules {component}\n    e.g. {cycle}"


def test_no_import_cycles() -> None:
    graph = import_graph()
    components = strongly_connected(graph)
    unexpected = [c for c in components if frozenset(c) not in ALLOWED_CYCLES]
    assert not unexpected, "import cycles inside tokenrails/:\n" + "\n".join(
        describe(graph, c) for c in unexpected
    )


def test_core_does_not_import_adapters() -> None:
    graph = import_graph()
    bad = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module.startswith(CORE)
        for target in targets
        if target.startswith(ABOVE_CORE)
    )
    assert not bad, "the core (guided/, kernels/) imports engine_patch/, compat/ or requests/:\n" + "\n".join(bad)


def test_graph_sees_function_level_imports() -> None:
    """The reader must count deferred imports, or it would miss the cycles they hide."""
    graph = import_graph()
    assert graph, "no modules found"
    total = sum(len(targets) for targets in graph.values())
    assert total > 100, f"only {total} import edges found: the reader is broken"


@pytest.mark.parametrize(
    ("module", "is_package", "level", "target", "expected"),
    [
        ("tokenrails.guided.spec", False, 1, "errors", "tokenrails.guided.errors"),
        ("tokenrails.guided.fsm", True, 1, "dfa", "tokenrails.guided.fsm.dfa"),
        ("tokenrails.guided.fsm.dfa", False, 2, "errors", "tokenrails.guided.errors"),
        ("tokenrails.guided.fsm.dfa", False, 1, None, "tokenrails.guided.fsm"),
    ],
)
def test_relative_imports_resolve(module, is_package, level, target, expected) -> None:
    assert _resolve_relative(module, is_package, level, target) == expected


def test_cycle_finder_on_a_toy_graph() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert sorted(strongly_connected(graph)) == [["a", "b", "c"], ["e"]]
    assert one_cycle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]


# tokenrails' public API: the package's names and the adapters' (tests/test_public_api.py pins both)
PUBLIC_MODULES = frozenset({
    "tokenrails", "tokenrails.requests", "tokenrails.compat.xgrammar", "tokenrails.engine_patch.transformers",
    "tokenrails.engine_patch.lmdeploy", "tokenrails.engine_patch.lmdeploy.cpu",
})


def test_outlines_shim_reaches_the_core_through_the_public_api() -> None:
    graph = import_graph()
    below = sorted(f"{module} -> {target}" for module, targets in graph.items()
                   if module.startswith("tokenrails.compat.outlines") for target in targets
                   if not target.startswith("tokenrails.compat.outlines") and target not in PUBLIC_MODULES)
    assert not below, "the outlines shim imports tokenrails' internals (use its public API):\n" + "\n".join(below)
