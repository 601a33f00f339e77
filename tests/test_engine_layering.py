"""Layers that import only downward: the engine's layer rule, and app/'s one way into the engine.

Every import is counted (top level, inside functions, under ``TYPE_CHECKING``), from an ``ast`` walk over the
source, so that no late import can close a circle the module-level imports do not show. The layers and what
goes where: docs/architecture.md.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Lowest first. A module may import from its own layer and those below it. An entry names a module or a package
# (the package's modules with it); every module of engine/ must fall in exactly one.
LAYERS: list[tuple[str, frozenset[str]]] = [
    (
        "core",
        frozenset(
            {
                "engine.timeline",
                "engine.events",
                "engine.errors",
                "engine.files",
                "engine.jit",
                "engine.hooks",
                "engine.streaming",
                "engine.weight_names",
                "engine.kernel_cache",
            }
        ),
    ),
    ("loading and ops", frozenset({"engine.loading", "engine.ops"})),
    ("kernels", frozenset({"engine.kernels"})),
    ("networks", frozenset({"engine.networks"})),
    ("numerics", frozenset({"engine.numerics"})),
    ("model", frozenset({"engine.model", "engine.random_model"})),
    ("session", frozenset({"engine.session", "engine.tools", "engine.tool_turn"})),
    ("instrumentation", frozenset({"engine.profiler", "engine.counters", "engine.pricing", "engine.profile_log"})),
    ("facade", frozenset({"engine"})),
]

# What app/ may import of the engine: the facade, and the modules the UI reads without MLX.
APP_MAY_IMPORT = frozenset({"engine", "engine.events", "engine.timeline", "engine.errors"})


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    relative = Path(*name.split("."))
    return (ROOT / relative.with_suffix(".py")).is_file() or (ROOT / relative / "__init__.py").is_file()


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, wherever the import statement is; ``from package import submodule``
    counts as the submodule."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names if _is_module(f"{target}.{alias.name}"))
    return found


def engine_graph() -> dict[str, set[str]]:
    """Each engine module and the engine modules it imports."""
    graph = {}
    for path in sorted((ROOT / "engine").rglob("*.py")):
        imports = imported_modules(path)
        graph[module_name(path)] = {m for m in imports if (m == "engine" or m.startswith("engine.")) and _is_module(m)}
    return graph


def layer_of(module: str) -> int:
    matches = [
        rank
        for rank, (_, members) in enumerate(LAYERS)
        for member in members
        if module == member or (member != "engine" and module.startswith(member + "."))
    ]
    assert len(matches) == 1, f"{module} is in {len(matches)} layers; place it in one (tests/test_engine_layering.py)"
    return matches[0]


def upward_edges(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {
        (module, target)
        for module, targets in graph.items()
        for target in targets
        if target != module and layer_of(target) > layer_of(module)
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles (strongly connected components of more than one module), by Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target == node or target not in graph:
                continue
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
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_engine_module_has_one_layer() -> None:
    graph = engine_graph()
    assert len(graph) > 50
    for module in graph:
        layer_of(module)


def test_engine_modules_import_only_their_own_or_lower_layers() -> None:
    upward = upward_edges(engine_graph())
    described = [f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})" for a, b in sorted(upward)]
    assert not described, "imports that point up a layer:\n" + "\n".join(described)


def test_the_engine_has_no_import_circle() -> None:
    assert cycles(engine_graph()) == []


def test_the_walk_sees_late_and_type_checking_imports(tmp_path: Path) -> None:
    """The checks above count what only runs later (an import in a function, or for the type checker)."""
    graph = engine_graph()
    assert "engine.events" in graph["engine.hooks"]  # under TYPE_CHECKING only
    assert "engine.model" in graph["engine"]  # the facade's names, for the type checker
    # A circle closed by an import inside a function is found.
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_app_imports_only_the_engine_facade() -> None:
    """app/ reaches the engine through ``engine`` (the facade) and the MLX-free events, timeline and errors."""
    reached = {
        (module_name(path), target)
        for path in sorted((ROOT / "app").glob("*.py"))
        for target in imported_modules(path)
        if target == "engine" or target.startswith("engine.")
    }
    assert reached, "app/ imports the engine somewhere"
    beyond = sorted(f"{module} imports {target}" for module, target in reached if target not in APP_MAY_IMPORT)
    assert not beyond, "app/ reaches past the facade:\n" + "\n".join(beyond)


def test_the_facade_and_the_ui_modules_of_the_engine_import_no_mlx() -> None:
    """``import engine`` runs the facade first: it loads its names on first use, so the UI stays free of MLX."""
    code = (
        "import sys\n"
        "import engine, engine.events, engine.timeline, engine.errors\n"
        "assert 'Session' in dir(engine) and 'load_voicechat' in engine.__all__\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'mlx'}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def test_every_facade_name_resolves() -> None:
    import engine

    for name in engine.__all__:
        assert getattr(engine, name) is not None, name
