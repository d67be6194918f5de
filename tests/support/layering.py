"""The library's import contract, read from the code and checked against it.

Each top-level unit of scripts/rlbench/ (a package, or a module directly under rlbench/) states in its
docstring the units it builds on, as one line `Builds on: a, b.` (or `Builds on: nothing in the
library.`). `problems(root)` lists every way the code breaks that contract:

- a unit states no `Builds on:` line, names an unknown unit, or the stated units form a cycle;
- a module imports a unit its own unit does not build on, directly or through the units it names (the
  layer order: a unit may use what lies below it, never what lies above or beside it);
- modules, or sibling packages at any depth, import each other in a cycle;
- a module imports a private name (`_name`) from another module, or reaches one as `module._name`;
- a reference agent (scripts/agents/) imports the library: agents are external clients.

Imports inside functions count: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

BUILDS_ON = re.compile(r"^Builds on: (.+?)\.?\s*$", re.M)
NOTHING = "nothing in the library"


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package at `root` (scripts/rlbench)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def unit_of(module: str) -> str:
    """The top-level unit a module belongs to: `rlbench.grader.snapshot` -> `grader`; the root package -> ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _target(module: str, node: ast.ImportFrom, is_package: bool) -> str | None:
    if not node.level:
        return node.module
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


class Imports:
    """What one module imports from the library: module edges, private names, module aliases."""

    def __init__(self, module: str, path: Path, known: dict[str, Path], top: str):
        self.edges: set[str] = set()
        self.private: list[tuple[str, str]] = []  # (source module, name)
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        aliases: dict[str, str] = {}  # local name -> library module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == top:
                        self.edges.add(alias.name)
                        if alias.asname:
                            aliases[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom):
                target = _target(module, node, is_package)
                if not target or target.split(".")[0] != top:
                    continue
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    if full in known:  # `from package import module`
                        self.edges.add(full)
                        aliases[alias.asname or alias.name] = full
                    else:
                        self.edges.add(target)
                        if alias.name.startswith("_") and not alias.name.startswith("__") and target != module:
                            self.private.append((target, alias.name))
        for node in ast.walk(tree):  # `module._private` through a name bound to another library module
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                base = node.value
                if isinstance(base, ast.Name) and base.id in aliases and aliases[base.id] != module:
                    self.private.append((aliases[base.id], node.attr))


def declared(root: Path, known: dict[str, Path]) -> tuple[dict[str, set[str]], list[str]]:
    """Each unit's stated `Builds on:` units, and the problems with the statements themselves."""
    units = sorted({unit_of(m) for m in known} - {""})
    stated: dict[str, set[str]] = {}
    problems = []
    for unit in units:
        path = known[f"{root.name}.{unit}"]
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        match = BUILDS_ON.search(doc)
        if not match:
            problems.append(f"{path}: its docstring states no `Builds on:` line (the units it may import, or '{NOTHING}')")
            continue
        names = set() if match.group(1).strip() == NOTHING else {n.strip() for n in match.group(1).split(",")}
        for name in sorted(names - set(units)):
            problems.append(f"{path}: `Builds on:` names {name!r}, which is not a unit of {root.name} ({', '.join(units)})")
        stated[unit] = names & set(units)
    for cycle in cycles({u: deps for u, deps in stated.items()}):
        problems.append(f"the stated layers form a cycle: {' -> '.join(cycle)}")
    return stated, problems


def below(stated: dict[str, set[str]], unit: str) -> set[str]:
    """Every unit `unit` may import: what it builds on, and what those build on, down to the bottom."""
    seen: set[str] = set()
    todo = list(stated.get(unit, ()))
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(stated.get(name, ()))
    return seen


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a closed path) per strongly connected component with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(_closed_path(graph, set(component)))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _closed_path(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A readable cycle inside a strongly connected component: from its smallest node back to it."""
    start = min(component)
    path, seen = [start], {start}
    node = start
    while True:
        nxt = sorted(n for n in graph.get(node, ()) if n in component)
        back = [n for n in nxt if n == start]
        if back and len(path) > 1:
            return [*path, start]
        fresh = [n for n in nxt if n not in seen]
        if not fresh:
            return [*path, start]
        node = fresh[0]
        path.append(node)
        seen.add(node)


def problems(root: Path, agents: Path | None = None) -> list[str]:
    """Every breach of the import contract in the library at `root` (and the reference agents at `agents`)."""
    known = modules(root)
    top = root.name
    stated, found = declared(root, known)
    imports = {module: Imports(module, path, known, top) for module, path in known.items()}

    for module, imp in sorted(imports.items()):
        unit = unit_of(module)
        allowed = below(stated, unit)
        for target in sorted(imp.edges):
            other = unit_of(target)
            if other in ("", unit) or other in allowed:
                continue
            found.append(
                f"{module} imports {target}: {unit} does not build on {other} (it builds on: "
                f"{', '.join(sorted(stated.get(unit, ()))) or 'nothing'}); move the shared code down to a unit both may "
                f"import, or state the dependency in {unit}'s `Builds on:` if it respects the layers"
            )
        for source, name in imp.private:
            found.append(f"{module} uses the private name {name} of {source}: make it public there, or keep it in one module")

    # Cycles between modules, and between sibling packages at every depth (a.b.c and a.b.d collapse to a.b).
    graphs = [{module: imp.edges - {module} for module, imp in imports.items()}]  # module by module
    for level in range(2, max(len(m.split(".")) for m in known)):
        graph: dict[str, set[str]] = defaultdict(set)
        for module, imp in imports.items():
            src = ".".join(module.split(".")[:level])
            for target in imp.edges:
                dst = ".".join(target.split(".")[:level])
                # A package and what lies inside it are one node at this depth; deeper depths see inside.
                if src != dst and not dst.startswith(src + ".") and not src.startswith(dst + "."):
                    graph[src].add(dst)
        graphs.append(graph)
    for graph in graphs:
        for cycle in cycles(graph):
            message = f"import cycle: {' -> '.join(cycle)}"
            if message not in found:
                found.append(message)

    if agents is not None:
        for path in sorted(agents.rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                    [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                for name in names:
                    if name.split(".")[0] == top:
                        found.append(f"{path}: the reference agent imports {name}; agents use only the workspace, "
                                     "the environment and public libraries")
    return found
