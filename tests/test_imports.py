"""The autograder's and kvref's modules import each other in one direction: no circle, also none through an
import placed inside a function; and each stage of the autograder imports only the stages before it. The graph is
read from the source with `ast`, so nothing is imported to build it."""

from __future__ import annotations

import ast
from pathlib import Path

from autograder.grade.course import ROOT

PACKAGE = ROOT / "autograder"
# The pipeline's stages in order, one folder each (autograder/<stage>/); a module may import its own stage and
# the ones before it; the commands sit on top, beside the folders. A new folder or top module gets its place here
# (the tests below fail until it has one).
STAGES = ["shared", "intake", "grade", "record", "export", "report"]
TOP = ["batch", "check", "gradescope", "student", "bench", "mutation", "commands", "__main__"]


def imported_modules(path: Path, package: str = "autograder", depth: int = 1) -> set[str]:
    """The modules of ``package`` that ``path`` imports anywhere in it (top level, functions, classes). ``depth``
    is the relative-import level that reaches the package's top (1 for its own modules, 2 inside a subpackage)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == depth:  # from . import x / from .x import y
            found |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package + "."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.ImportFrom) and node.module == package:
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith(package + ".")}
    return found


def import_graph(package: Path = PACKAGE, name: str | None = None) -> dict[str, set[str]]:
    """{module: the package's modules it imports}; the package's own __init__ is left out (it imports the
    modules it re-exports, and none imports it back); ``name`` is the package's import name (its folder's by
    default). A subpackage (kvref.bench) is one node: the union of its
    files' imports of the package's other modules."""
    files = {p.stem: [(p, 1)] for p in package.glob("*.py") if p.stem != "__init__"}
    for sub in sorted(d for d in package.iterdir() if (d / "__init__.py").is_file()):
        files[sub.name] = [(p, len(p.relative_to(package).parts)) for p in sorted(sub.rglob("*.py"))]
    pkg = name or package.name
    return {node: set().union(*(imported_modules(p, pkg, depth) for p, depth in found)) & set(files) - {node}
            for node, found in sorted(files.items())}


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` as [a, b, ..., a], or None (depth-first search, three colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_autograder_has_no_import_circle():
    graph = import_graph()
    assert len(graph) > 10 and sum(map(len, graph.values())) > 20  # the graph was read
    circle = find_circle(graph)
    assert circle is None, "import circle: " + " -> ".join(circle)


def test_kvref_has_no_import_circle():
    """The model, the layer kinds and MLA share their parts through kvref.modules; the ledger (memory) sits above
    the planner and both count in kvref.units; the prefix pool sits above the block pool (kvref.pool)."""
    graph = import_graph(ROOT / "kvref")
    assert {"model", "layers", "mla", "memory", "planner", "paged", "prefix", "bench"} <= set(graph)
    assert "cache" in graph["model"] and "cache" in graph["paged"] and "config" in graph["planner"]  # the graph was read
    circle = find_circle(graph)
    assert circle is None, "import circle in kvref: " + " -> ".join(circle)


def test_each_stage_imports_only_the_stages_before_it():
    """Each stage folder is one node of the graph (all its files together); the commands on top may import any
    stage, a stage never imports a command."""
    rank = {m: i for i, m in enumerate(STAGES)} | {m: len(STAGES) for m in TOP}
    graph = import_graph()
    assert set(STAGES) <= set(graph), f"stage folders missing: {sorted(set(STAGES) - set(graph))}"
    assert not set(graph) - set(rank), f"modules or folders without a place in STAGES/TOP: {sorted(set(graph) - set(rank))}"
    assert "shared" in graph["grade"] and "grade" in graph["batch"]  # the graph was read
    name = lambda m: m if m in STAGES else f"{m} (top)"  # noqa: E731
    wrong = [f"{name(m)} imports {name(d)}" for m in sorted(graph) for d in sorted(graph[m])
             if rank[d] > rank[m]]
    assert not wrong, "imports against the order of the stages:\n" + "\n".join(wrong)


def test_a_stage_is_a_folder_that_says_what_it_takes_and_gives():
    """A newcomer opening autograder/ sees the stages as folders; each __init__ docstring says what the stage
    takes and what it gives, and no module is left loose beside them except the commands."""
    loose = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert loose == sorted(TOP), f"modules outside the stage folders that are not commands: {sorted(set(loose) - set(TOP))}"
    for stage in STAGES:
        init = PACKAGE / stage / "__init__.py"
        assert init.is_file(), f"autograder/{stage}/ is not a package"
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert "Takes:" in doc and "Gives:" in doc, f"autograder/{stage}/__init__.py: say what the stage takes and gives"
        modules = sorted(p.stem for p in (PACKAGE / stage).glob("*.py") if p.stem != "__init__")
        missing = [m for m in modules if m not in doc]
        assert not missing, f"autograder/{stage}/__init__.py does not name its modules {missing}"


def test_find_circle_sees_a_circle_through_a_function_level_import(tmp_path):
    """The check itself: an import inside a function closes a circle as much as one at the top."""
    (tmp_path / "a.py").write_text("from . import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from .c import g\n    return g\n")
    (tmp_path / "c.py").write_text("import os\n\ndef g():\n    from autograder.a import x\n")
    (tmp_path / "d.py").write_text("from .a import b\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "__init__.py").write_text("")
    (tmp_path / "sub" / "e.py").write_text("from ..d import x\nfrom . import f\n")  # a subpackage is one node
    graph = import_graph(tmp_path, "autograder")
    assert graph == {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "sub": {"d"}}
    assert find_circle(graph) == ["a", "b", "c", "a"]
    (tmp_path / "c.py").write_text("import os\n")
    assert find_circle(import_graph(tmp_path, "autograder")) is None
