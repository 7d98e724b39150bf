"""The shape of the code itself: short functions, imports that flow one way, a light generator.

These read gptlib's source with ``ast``; nothing is excluded. A new module must be given a layer
in LAYERS below, and may import only from lower layers.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import gptlib

PACKAGE = Path(gptlib.__file__).parent
MAX_FUNCTION_LINES = 60

# Imports flow from higher layers to strictly lower ones: configuration -> model ->
# checkpoint / hf -> train / generate (each ends with its command-line main).
LAYERS = {
    "gptlib.config": 0,
    "gptlib.tokenizer": 0,
    "gptlib.data": 0,
    "gptlib.distributed": 0,
    "gptlib.loss": 0,
    "gptlib.notebook": 0,
    "gptlib.rundir": 0,  # the output folder: writable, locked, tidy
    "gptlib.model": 1,
    "gptlib.integrity": 1,  # checksums and field checks of checkpoint contents
    "gptlib.memory": 1.5,  # memory estimates (uses the model on the meta device)
    "gptlib.cli": 1,  # argparse helpers shared by the two commands
    "gptlib.checkpoint": 2,
    "gptlib.hf_common": 2,  # what the two Hugging Face bridges share
    "gptlib.hf_llama": 2.5,  # the Llama bridge (chapter 13), used through gptlib.hf
    "gptlib.hf": 2.75,
    "gptlib.example": 2,
    "gptlib.plot": 2,
    "gptlib.train": 3,
    "gptlib.generate": 3,
    "gptlib": 4,  # the package's __init__: re-exports, on top of everything
}


def modules() -> dict[str, ast.Module]:
    found = {}
    for path in sorted(PACKAGE.glob("*.py")):
        name = "gptlib" if path.stem == "__init__" else f"gptlib.{path.stem}"
        found[name] = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return found


def imported_modules(tree: ast.Module, known: set[str]) -> set[str]:
    """Every gptlib module ``tree`` imports, anywhere (top level, functions, TYPE_CHECKING)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == "gptlib":  # of its submodules
            out |= {f"gptlib.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return {name for name in out if name in known}


def import_graph() -> dict[str, set[str]]:
    trees = modules()
    return {name: imported_modules(tree, set(trees)) - {name} for name, tree in trees.items()}


def test_every_function_is_at_most_60_lines():
    too_long = []
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}.{node.name}: {lines} lines")
    assert not too_long, too_long


def test_every_module_has_a_layer():
    assert set(modules()) == set(LAYERS), "give a new module a layer in LAYERS"


def test_imports_flow_from_higher_to_lower_layers():
    wrong = [
        f"{a} (layer {LAYERS[a]}) imports {b} (layer {LAYERS[b]})"
        for a, targets in import_graph().items()
        for b in targets
        if LAYERS[b] >= LAYERS[a]
    ]
    assert not wrong, wrong


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            pytest.fail("import cycle: " + " -> ".join([*path[path.index(node) :], node]))
        if node in done:
            return
        for target in sorted(graph[node]):
            visit(target, [*path, node])
        done.add(node)

    for node in graph:
        visit(node, [])
    # the check can fail: a made-up edge back from model to train is found
    graph["gptlib.model"] = graph["gptlib.model"] | {"gptlib.train"}
    done.clear()
    with pytest.raises(pytest.fail.Exception, match="import cycle"):
        for node in graph:
            visit(node, [])


def test_generation_does_not_load_the_training_loop():
    graph = import_graph()
    reach, todo = set(), ["gptlib.generate"]
    while todo:
        for target in graph[todo.pop()] - reach:
            reach.add(target)
            todo.append(target)
    assert "gptlib.train" not in reach
    # and at run time: the generate command imports neither gptlib.train nor tqdm through gptlib
    code = "import sys, runpy; sys.argv = ['generate', '--help']; "
    code += "runpy.run_module('gptlib.generate', run_name='__main__')"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True
    )
    assert done.returncode == 0 and "usage: python -m gptlib.generate" in done.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert {"gptlib.model", "gptlib.checkpoint", "gptlib.cli"} <= imported  # the measure works
    assert "gptlib.train" not in imported
    assert "RuntimeWarning" not in done.stderr  # the package does not pre-import the module


def test_the_benchmark_lives_outside_the_package():
    assert not (PACKAGE / "bench.py").exists()
    assert (PACKAGE.parent / "benchmarks" / "bench.py").is_file()
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("benchmarks"), name
