"""The rlkit subpackages form a layering: no import cycle between them, nor between modules.

Every `import` / `from ... import` under rlkit/ is parsed with `ast`, including imports inside
functions (a back-edge hidden in a function is still a cycle), and mapped to the importing and
imported subpackage (`rlkit.hub.install` -> `hub`; a top-level module such as `rlkit.config` is
its own node). The graph must be acyclic.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

RLKIT = Path(__file__).resolve().parents[2] / "rlkit"


def _node(module: str) -> str | None:
    """The rlkit subpackage or top-level module that a dotted module name belongs to."""
    parts = module.split(".")
    if parts[0] != "rlkit" or len(parts) < 2 or parts[1] == "__init__":
        return None
    return parts[1]


def imported_modules(tree: ast.AST, package: str) -> set[str]:
    """Absolute names of everything `tree` imports (`package` resolves relative imports)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            anchor = package.split(".")[: len(package.split(".")) - max(node.level - 1, 0)]
            base = ".".join([*anchor, node.module or ""]) if node.level else node.module or ""
            found.add(base.rstrip("."))
    return found


def subpackage_graph() -> dict[str, set[str]]:
    """{node: nodes it imports} over every .py file under rlkit/."""
    graph: dict[str, set[str]] = {}
    for path in sorted(RLKIT.rglob("*.py")):
        parts = path.relative_to(RLKIT.parent).with_suffix("").parts
        source = _node(".".join(parts))
        if source is None:
            continue
        package = ".".join(parts if parts[-1] == "__init__" else parts[:-1])
        package = package.removesuffix(".__init__")
        targets = {_node(m) for m in imported_modules(ast.parse(path.read_text()), package)}
        graph.setdefault(source, set()).update(t for t in targets if t and t != source)
    return graph


def test_no_cycle_between_rlkit_subpackages() -> None:
    graph = subpackage_graph()
    assert {"envs", "eval", "hub", "orchestrator", "launch", "trainer"} <= graph.keys()
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        pytest.fail(f"import cycle between rlkit subpackages: {' -> '.join(exc.args[1])}")


def module_graph() -> dict[str, set[str]]:
    """{module: rlkit modules it imports}; `from pkg import name` counts as `pkg.name` when that
    is a module, else as `pkg` (its __init__)."""
    modules: dict[str, tuple[Path, str]] = {}
    for path in sorted(RLKIT.rglob("*.py")):
        parts = path.relative_to(RLKIT.parent).with_suffix("").parts
        name = ".".join(parts).removesuffix(".__init__")
        modules[name] = (path, name if path.name == "__init__.py" else ".".join(parts[:-1]))
    graph: dict[str, set[str]] = {}
    for name, (path, package) in modules.items():
        edges = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                (base,) = imported_modules(ast.Module(body=[node], type_ignores=[]), package)
                for alias in node.names:
                    edges.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        edges.intersection_update(modules.keys() - {name})
    return graph


def test_no_cycle_between_rlkit_modules() -> None:
    """Within a subpackage too (e.g. a config module and the registry it validates against)."""
    graph = module_graph()
    assert "rlkit.trainer.loss" in graph["rlkit.trainer.config"]
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        pytest.fail(f"import cycle between rlkit modules: {' -> '.join(exc.args[1])}")


def test_the_layering_is_the_documented_one() -> None:
    graph = subpackage_graph()
    assert "hub" in graph["envs"]  # the loader installs hub environments
    assert "envs" not in graph["hub"] and "eval" not in graph["hub"]
    assert {"envs", "hub"} <= graph["eval"]  # eval results are published by rlkit.eval
    assert "launch" not in graph["orchestrator"]  # the whole job's config lives above it
    # the orchestrator-trainer contract sits below both: data flows one way through it
    assert "protocol" in graph["orchestrator"] and "protocol" in graph["trainer"]
    assert not {"orchestrator", "trainer", "launch"} & graph["protocol"]
    # the orchestrator learns everything about a version from the protocol's record, and the
    # weight transports serve both sides without importing either
    assert "trainer" not in transitive(graph, "orchestrator")
    assert not {"orchestrator", "trainer", "launch"} & transitive(graph, "weights")


def transitive(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every node `start` reaches through imports."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for node in graph.get(todo.pop(), set()) - seen:
            seen.add(node)
            todo.append(node)
    return seen


def test_the_environment_side_imports_no_ml_framework() -> None:
    """Environments, `rlkit eval` and `rlkit env check` talk to servers over HTTP: importing
    them must not pull torch, transformers or vLLM (seconds of start-up for every eval and
    environment process; the weight transports and the orchestrator's pool bring torch)."""
    heavy = ("torch", "transformers", "vllm")
    code = (
        "import sys, rlkit.envs, rlkit.envs.check, rlkit.eval.runner\n"
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == "[]", done.stdout


def test_imports_inside_functions_and_relative_imports_count() -> None:
    tree = ast.parse(
        "def f():\n    from rlkit.hub import install\n    import rlkit.eval.store\n"
        "from ..trainer import batch\n"
    )
    found = imported_modules(tree, "rlkit.orchestrator")
    assert {"rlkit.hub", "rlkit.eval.store", "rlkit.trainer"} <= found
    graph = {"envs": {"hub"}, "hub": {"eval"}, "eval": {"envs"}}
    with pytest.raises(CycleError):
        TopologicalSorter(graph).prepare()
