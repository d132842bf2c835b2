"""Fail (exit 1) when the modules of a package import each other in a cycle; print each cycle.

    .venv/bin/python scripts/check_import_cycles.py              # hybridmem_local
    .venv/bin/python scripts/check_import_cycles.py path/to/pkg

Every import statement counts, wherever it stands: at module level, inside a function (a lazy
import only postpones the dependency) and under ``if TYPE_CHECKING`` (a type is a dependency
too). The implicit import of a parent package's ``__init__`` does not count, or every module
would form a cycle with the ``__init__`` that re-exports it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def module_names(package_dir: Path) -> dict[str, Path]:
    """Dotted module name → file, for every ``.py`` file of the package."""
    root = package_dir.parent
    names = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``module`` imports."""
    return set(import_lines(module, path, known))


def import_lines(module: str, path: Path, known: set[str]) -> dict[str, int]:
    """The package modules ``module`` imports → the line of its first import of each."""
    is_package = path.name == "__init__.py"
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # ``from pkg import module`` imports that module, and pkg itself (its ``__init__``) only
            # when it also takes a name defined there.
            submodules = [f"{base}.{alias.name}" for alias in node.names]
            names = [name for name in submodules if name in known]
            if len(names) < len(submodules):
                names.append(base)
        for name in names:
            owner = _owner(name, known)
            if owner is not None and owner != module:
                found[owner] = min(found.get(owner, node.lineno), node.lineno)
    return found


def _owner(name: str, known: set[str]) -> str | None:
    """The package module an imported name lives in (the longest known prefix)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in known:
            return candidate
    return None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles (paths back to their start) covering every module that is in one: per strongly
    connected component of 2+ modules, a shortest cycle through each member no earlier one passed."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    found = []
    for component in components:
        covered: set[str] = set()
        for start in component:
            if start not in covered:
                found.append(_path_within(graph, start, set(component)))
                covered.update(found[-1])
    return found


def _path_within(graph: dict[str, set[str]], start: str, members: set[str]) -> list[str]:
    """A shortest cycle through ``start`` that stays among ``members`` (its component)."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node] & members):
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if target not in previous:
                    previous[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"{start} is in a strongly connected component but on no cycle")


def main(argv: list[str]) -> int:
    package_dir = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent / "hybridmem_local"
    modules = module_names(package_dir)
    graph = {name: imports_of(name, path, set(modules)) for name, path in modules.items()}
    found = cycles(graph)
    if not found:
        print(f"no import cycle among {len(modules)} modules of {package_dir.name}")
        return 0
    for cycle in found:
        print("import cycle: " + " -> ".join(cycle))
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
