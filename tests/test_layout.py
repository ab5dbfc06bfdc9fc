"""One source for each rule (issue 19): the states a module groups together are named in
aso/model.py, and the store's JavaScript takes them from there (lib/model, the tables `aso db
init` writes into the views, the pages' settings); nothing else spells a subset of states out."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from aso import designdocs, model
from aso.config import Config

ROOT = Path(__file__).resolve().parent.parent
STATE_NAMES = {name for values in model.STATES.values() for name in values}
_ALT = "|".join(sorted(STATE_NAMES, key=len, reverse=True))
JS_ARRAY = re.compile(rf"\[\s*['\"]({_ALT})['\"]\s*(,\s*['\"]({_ALT})['\"]\s*)+\]")
JS_CHAIN = re.compile(rf"===\s*['\"]({_ALT})['\"]\s*\|\|[^;\n]*===\s*['\"]({_ALT})['\"]")


def python_subsets(path: Path) -> list[str]:
    """Tuple, list and set literals made of two or more state names."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Tuple | ast.List | ast.Set) and len(node.elts) >= 2:
            values = [e.value for e in node.elts if isinstance(e, ast.Constant)]
            if len(values) == len(node.elts) and all(v in STATE_NAMES for v in values):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {values}")
    return found


def test_no_module_spells_out_a_subset_of_states():
    modules = [*(ROOT / "aso").rglob("*.py"), *(ROOT / "agents").rglob("*.py")]
    assert len(modules) > 40
    found = [
        hit for path in modules if path != ROOT / "aso" / "model.py" for hit in python_subsets(path)
    ]
    assert found == []


def test_the_check_sees_a_subset_where_there_is_one():
    sample = ROOT / "aso" / "sample_for_the_layout_test.py"
    try:
        sample.write_text('IN_FLIGHT = ("acquired", "submitted")\nONE = ("done",)\n')
        assert python_subsets(sample) == [
            "aso/sample_for_the_layout_test.py:1: ['acquired', 'submitted']"
        ]
    finally:
        sample.unlink()
    assert JS_ARRAY.search("var ends = ['done', 'failed'];")
    assert JS_CHAIN.search("if (s === 'submitted' || s === 'kill_requested') {")


def test_the_store_s_javascript_takes_its_state_sets_from_the_model():
    scripts = list((ROOT / "couchapp").rglob("*.js"))
    assert len(scripts) > 10
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in scripts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if JS_ARRAY.search(line) or JS_CHAIN.search(line)
    ]
    assert found == []


def test_the_assembled_design_documents_carry_the_model_s_tables():
    config = Config()
    docs = {ddoc["_id"]: ddoc for ddoc in designdocs.design_documents(config)}
    work = docs["_design/queue"]["views"]["work"]["map"]
    assert designdocs.json.dumps(model.WORK) in work
    for ddoc in docs.values():
        for view in ddoc.get("views", {}).values():
            assert "/* aso/model.py" not in view["map"], ddoc["_id"]
    pages = docs[designdocs.PAGES_DDOC]["aso"]["states"]
    assert pages["on_its_way"] == list(model.ON_ITS_WAY)
    assert pages == {k: list(v) for k, v in model.PAGES_STATES.items()}


def import_graph() -> dict[str, set[str]]:
    """module → the modules of aso/ and agents/ it imports, at the top or inside a function
    (an import inside a function is where a cycle hides). A package's own submodules import
    the package first in any case: that edge is not counted."""
    modules = {}
    for package in ("aso", "agents"):
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                found = resolve(target)
                if found and found != name and not name.startswith(found + "."):
                    graph[name].add(found)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles():
    graph = import_graph()
    assert "aso.managed" in graph["aso.supervisor"]  # the walk sees imports at all
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
