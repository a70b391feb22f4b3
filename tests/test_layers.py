"""The package's layers import downward only, and no module imports itself round a loop.

Read from the source (ast), every import counted, module-level or inside a function: a lazy
import hides an edge from a reader but not from this test. docs/internals.md draws the same map.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"cudal2": REPO / "cudal2", "cudal2_rl": REPO / "rl"}

# Bottom to top. A module may import its own layer (without a loop) and any layer below it.
LAYERS = [
    ("core", ["cudal2.core"]),            # ABI, identity, vocabulary, knobs, toolchain, build, store
    ("timing", ["cudal2.timing"]),        # the kernel timer and its statistics
    ("runtime", ["cudal2", "cudal2.runtime"]),   # the product: plan, load, race, hot path, op
    ("harness", ["cudal2.harness"]),      # audit, correctness, baselines, measurement, results DB
    ("templates", ["cudal2.templates"]),  # kernel families (source as data)
    ("search", ["cudal2.search"]),        # cost model, tune
    ("runs", ["cudal2.runs"]),            # bench, campaign, export, report, overhead
    ("cli", ["cudal2.cli", "cudal2.__main__"]),
    ("rl", ["cudal2_rl"]),                # the RL loop stands on all of the library
]


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg, root in PACKAGES.items():
        for f in root.rglob("*.py"):
            parts = [p for p in f.relative_to(root).with_suffix("").parts if p != "__init__"]
            mods[".".join([pkg, *parts])] = f
    return mods


MODULES = _modules()


def _layer(mod: str) -> int:
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (mod == p or mod.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    assert best is not None, f"{mod} is in no layer: add it to LAYERS and docs/internals.md"
    return best


def _imports(mod: str, path: Path) -> set[str]:
    """The project modules `mod` imports (`from pkg import name` counts pkg.name when that is a module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = here[:len(here) - (node.level - 1)]
                base = ".".join(pkg + ([node.module] if node.module else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for n in names:
            while n and n not in MODULES:   # `import cudal2.core.abi as x` -> the module itself
                n = n.rpartition(".")[0]
            if n and n != mod:
                out.add(n)
    return out


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def test_every_module_has_a_layer():
    for m in MODULES:
        _layer(m)


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_imports_go_downward(mod):
    mine = _layer(mod)
    up = sorted(d for d in GRAPH[mod] if _layer(d) > mine)
    assert not up, (f"{mod} (layer {LAYERS[mine][0]}) imports from above: "
                    + ", ".join(f"{d} ({LAYERS[_layer(d)][0]})" for d in up))


def test_no_import_loops():
    index, low, on_stack, stack, loops = {}, {}, set(), [], []

    def visit(v):   # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                loops.append(sorted(comp))

    for m in sorted(GRAPH):
        if m not in index:
            visit(m)
    assert not loops, f"import loops: {loops}"


def test_the_test_sees_the_real_graph():
    # guards the reader above: known edges of the layout must be found
    assert "cudal2.core.abi" in GRAPH["cudal2.runtime.loader"]
    assert "cudal2.timing.kerneltime" in GRAPH["cudal2.harness.baselines"]
    assert "cudal2.harness.pipeline" in GRAPH["cudal2.search.tune"]
