"""The package's layers, checked: which parts import without torch, and that no modules import each
other in a circle (read from the source with ast, so a lazy import inside a function counts too:
a circle hidden in a function is still a circle)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "agentkv"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The agentkv modules `path` imports, anywhere in it but under `if TYPE_CHECKING:`."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for stmt in node.body for n in ast.walk(stmt)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            # `from agentkv.x import y` imports agentkv.x.y where y is a module, else agentkv.x
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports_of(p, modules) for p in paths}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of two or more modules (Tarjan), as a sorted list."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(10000)
    try:  # (restored: a later test relies on the default limit to see a grammar nest too deeply)
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return out


def test_no_import_cycles():
    """A circle is opened by moving the shared definition down a layer, not by hiding an import."""
    found = cycles(import_graph())
    assert not found, "modules that import each other in a circle: " + "; ".join(" <-> ".join(c) for c in found)


def test_cycle_finder_sees_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("package", ["agentkv.grammar", "agentkv.chat", "agentkv.agents", "agentkv"])
def test_layers_import_without_torch(package):
    """The grammar, the conversation protocol and the agents are usable (and testable) without
    torch: `import agentkv` loads the engine only when an engine name is first used."""
    code = f"import sys, {package}; assert 'torch' not in sys.modules, [m for m in sys.modules if 'agentkv' in m]"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


# what each torch-free layer may not reach, directly or through the modules it imports (the engine's
# lazy __init__, SamplingParams and its outputs are torch-free and open to all)
FORBIDDEN = {
    "agentkv.grammar": ("agentkv.engine.", "agentkv.kernels", "agentkv.chat", "agentkv.agents", "agentkv.server",
                        "agentkv.cli"),
    "agentkv.chat": ("agentkv.engine.", "agentkv.kernels", "agentkv.agents", "agentkv.server", "agentkv.cli"),
    "agentkv.agents": ("agentkv.engine.", "agentkv.kernels", "agentkv.server", "agentkv.cli"),
}
OPEN_TO_ALL = {"agentkv.engine.sampling_params", "agentkv.engine.outputs"}


def reachable(graph: dict[str, set[str]], start: set[str]) -> set[str]:
    seen, todo = set(start), list(start)
    while todo:
        for m in graph.get(todo.pop(), ()):
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layers_do_not_reach_up(layer):
    graph = import_graph()
    reach = reachable(graph, {m for m in graph if m == layer or m.startswith(layer + ".")})
    bad = sorted(m for m in reach - OPEN_TO_ALL if m.startswith(FORBIDDEN[layer]))
    assert not bad, f"{layer} reaches {bad}"


@pytest.mark.parametrize("old, names", [("agentkv.tools", ["Tool", "tool"]), ("agentkv.run_context", ["RunContext"])])
def test_old_import_paths_still_work_and_warn(old, names):
    import importlib

    import agentkv as ak

    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=old):
        module = importlib.import_module(old)
    assert all(getattr(module, n) is getattr(ak, n) for n in names)
