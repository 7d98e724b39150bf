"""The shape of the code itself: short functions, imports that flow one way, a light generator.

These read gptlib's source with ``ast``; nothing is excluded. A new module must be given a layer
in LAYERS below, and may import only from lower layers.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import gptlib

PACKAGE = Path(gptlib.__file__).parent
MAX_FUNCTION_LINES = 60

# Imports flow from higher layers to strictly lower ones: configuration -> model ->
# checkpoint / hf / fast -> train / generate -> the command lines. An import inside a module's
# ``if __name__ == "__main__":`` shim (``python -m gptlib.train``) is not part of the library.
LAYERS = {
    "gptlib.checks": 0,
    "gptlib.config": 0,
    "gptlib.files": 0,
    "gptlib.tokenizer": 0,
    "gptlib.distributed": 0,
    "gptlib.kv_cache": 0,
    "gptlib.notebook": 0,
    "gptlib.rundir": 0,  # the output folder: writable, locked, tidy
    "gptlib.interrupt": 0,  # Ctrl-C deferred to a step boundary
    "gptlib.data": 1,
    "gptlib.bpe": 1,  # the hand-built BPE of chapter 1, checked against gptlib.tokenizer's
    "gptlib.hf_tokenizer": 0,  # a Hugging Face tokenizer behind gptlib's interface (chapter 13)
    "gptlib.gguf_llama": 0,  # a Llama GGUF file's settings and weights (chapter 13)
    "gptlib.model": 1,
    "gptlib.integrity": 1,  # checksums and field checks of checkpoint contents
    "gptlib.checkpoint": 2,
    "gptlib.fast": 2,  # the speed paths, each equal to a piece of model / train
    "gptlib.hf_arch": 2,  # GPT-2 and Llama described for the Hugging Face bridge
    "gptlib.hf": 3,  # the bridge's conversions, written once for both
    "gptlib.memory": 3,  # memory estimates from a configuration (knows fast's loss path)
    "gptlib.example": 2,
    "gptlib.bits": 2,  # bits per byte (chapter 13)
    "gptlib.lora": 2,  # LoRA (chapter 14)
    "gptlib.pretrained": 4,  # SmolLM2 and other pretrained Llamas, through the bridge
    "gptlib.plot": 2,
    "gptlib.run": 4,  # a training run's state: seeding, resuming, saving
    "gptlib.generate": 4,
    "gptlib.train": 5,
    "gptlib.commands": 6,
    "gptlib.commands.options": 6,  # argparse helpers shared by the two commands
    "gptlib.commands.generate": 7,
    "gptlib.commands.train": 7,
    "gptlib": 8,  # the package's __init__: re-exports of the lower layers
}


def modules() -> dict[str, ast.Module]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return found


def _is_main_shim(node: ast.AST) -> bool:
    """``if __name__ == "__main__":``"""
    test = getattr(node, "test", None)
    return (
        isinstance(node, ast.If)
        and isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
    )


def imported_modules(tree: ast.Module, known: set[str]) -> set[str]:
    """Every gptlib module ``tree`` imports, anywhere (top level, functions, TYPE_CHECKING)."""
    out = set()
    library = ast.Module(body=[n for n in tree.body if not _is_main_shim(n)], type_ignores=[])
    for node in ast.walk(library):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module in ("gptlib", "gptlib.commands"):
            out |= {f"{node.module}.{alias.name}" for alias in node.names}
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
    assert {"gptlib.model", "gptlib.checkpoint", "gptlib.commands.options"} <= imported  # it works
    assert "gptlib.train" not in imported
    assert "RuntimeWarning" not in done.stderr  # the package does not pre-import the module


def test_the_benchmark_lives_outside_the_package():
    assert not (PACKAGE / "bench.py").exists()
    assert (PACKAGE.parent / "benchmarks" / "bench.py").is_file()
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("benchmarks"), name


def test_every_fast_path_names_the_test_that_proves_it():
    """gptlib.fast is audited: each public function or class names, in its docstring, a test of
    tests/test_fast.py that checks it against the book's code, and that test exists."""
    tests = (PACKAGE.parent / "tests" / "test_fast.py").read_text(encoding="utf-8")
    tree = modules()["gptlib.fast"]
    public = [
        node
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_")
    ]
    assert len(public) >= 8
    for node in public:
        doc = ast.get_docstring(node) or ""
        named = [w.strip("`(),.:;") for w in doc.split() if w.strip("`(),.:;").startswith("test_")]
        if node.name in ("attention", "block", "loss_of"):  # the pieces of FastLoss
            continue
        assert named, f"gptlib.fast.{node.name} names no test"
        for test in named:
            assert f"def {test}(" in tests, f"gptlib.fast.{node.name} names a missing {test}"


def test_the_entry_points_and_module_shims_reach_the_commands():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))
    scripts = project["project"]["scripts"]
    assert set(scripts) == {"gptlib-train", "gptlib-generate"}
    for name, target in scripts.items():
        module, func = target.split(":")
        assert module.startswith("gptlib.commands."), name  # commands live outside the library
        assert callable(getattr(importlib.import_module(module), func)), name
    for module in ("gptlib.train", "gptlib.generate"):  # python -m gptlib.train still works
        code = f"import runpy, sys; sys.argv = ['x', '--help']; runpy.run_module('{module}', "
        code += "run_name='__main__')"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert done.returncode == 0 and f"usage: python -m {module}" in done.stdout, done.stderr
