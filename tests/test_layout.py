"""One source for each rule (issue 19): the states a module groups together are named in
aso/model.py, and the store's JavaScript takes them from there (lib/model, the tables `aso db
init` writes into the views, the pages' settings); nothing else spells a subset of states out."""

from __future__ import annotations

import ast
import configparser
import re
from pathlib import Path

from aso import model
from aso.config import Config
from aso.provision import designdocs

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
        sample.write_text('IN_FLIGHT = ("submitted", "kill_requested")\nONE = ("done",)\n')
        assert python_subsets(sample) == [
            "aso/sample_for_the_layout_test.py:1: ['submitted', 'kill_requested']"
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
    assert designdocs.PAGES_DDOC not in docs  # the pages live in a database of their own
    settings = designdocs.pages_design(config)["aso"]
    assert settings["files_db"] == config.store.files_db
    assert settings["stats_db"] == config.store.stats_db
    pages = settings["states"]
    assert pages["on_its_way"] == list(model.ON_ITS_WAY)
    assert pages == {k: list(v) for k, v in model.PAGES_STATES.items()}


def module_of(path: Path) -> str:
    """A file's module: the top-level folders agents/ and sim/ are aso.agents and aso.sim."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(("aso", *parts) if parts[0] in ("agents", "sim") else parts)


def test_agents_and_sim_are_installed_under_aso():
    """agents/ and sim/ stay top-level folders, installed as aso.agents and aso.sim (links in
    aso/), never as top-level packages of their generic names; nothing imports those names."""
    for folder in ("agents", "sim"):
        link = ROOT / "aso" / folder
        assert link.is_symlink() and link.resolve() == ROOT / folder
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    assert config["options.packages.find"]["include"].split() == ["aso", "aso.*"]
    found = imports_of(("aso", "agents", "sim", "tests"))
    generic = {
        (module, name)
        for module, names in found.items()
        for name in names
        if name.split(".")[0] in ("agents", "sim")
    }
    assert generic == set()
    assert "aso.agents.AGENTS" in found["aso.cli.__init__"]  # the walk sees the imports


def import_graph() -> dict[str, set[str]]:
    """module → the modules of aso/ and agents/ it imports, at the top or inside a function
    (an import inside a function is where a cycle hides). A package's own submodules import
    the package first in any case: that edge is not counted."""
    modules = {}
    for package in ("aso", "agents"):
        for path in (ROOT / package).rglob("*.py"):
            name = module_of(path)
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
    assert "aso.local.managed" in graph["aso.supervisor"]  # the walk sees imports at all
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def imported_names(source: str, module: str) -> list[str]:
    """The full names a module's source imports, at the top or inside a function; a relative
    import is resolved against `module` (the dotted name of the file)."""
    package = module.split(".")[:-1]
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package[: len(package) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            names += [f"{base}.{alias.name}" for alias in node.names]
    return names


def cli_imports(path: Path) -> list[str]:
    """Where a file imports the CLI: aso.cli or any module of the aso/cli/ package."""
    module = module_of(path)
    return [
        f"{path.relative_to(ROOT)}: {name}"
        for name in imported_names(path.read_text(), module)
        if name == "aso.cli" or name.startswith("aso.cli.")
    ]


def test_the_cli_is_the_top_layer():
    """Only the aso/cli/ package imports aso.cli: the library, the agents and the simulator use
    library modules (the CLI imports them, never the other way round). aso/__main__.py is the
    command itself (`python -m aso`, how `aso run` starts agent processes)."""
    cli = ROOT / "aso" / "cli"
    entry_point = ROOT / "aso" / "__main__.py"
    assert cli_imports(entry_point) == ["aso/__main__.py: aso.cli.main"]
    below = [
        path
        for package in ("aso", "agents", "sim")
        for path in (ROOT / package).rglob("*.py")
        if cli not in path.parents and path != entry_point
    ]
    assert len(below) > 60
    assert [hit for path in below for hit in cli_imports(path)] == []
    # the walk sees the CLI's own imports of its modules
    assert cli_imports(cli / "__init__.py")


def test_the_cli_check_sees_an_import_of_the_cli():
    found = [
        imported_names(source, "aso.sample")
        for source in (
            "import aso.cli\n",
            "from aso import cli\n",
            "from aso.cli import main\n",
            "def f():\n    from aso.cli.sim import parse_duration\n",
            "from .cli.common import config_of\n",
        )
    ]
    assert [n for names in found for n in names if n == "aso.cli" or n.startswith("aso.cli.")] == [
        "aso.cli",
        "aso.cli",
        "aso.cli.main",
        "aso.cli.sim.parse_duration",
        "aso.cli.common.config_of",
    ]
    assert imported_names("from aso import client, model\n", "aso.sample") == [
        "aso.client",
        "aso.model",
    ]


# The entry layer: the only modules outside aso/local/ that may start what it holds.
STARTS_LOCAL_PARTS = ("aso.cli", "aso.supervisor", "aso.__main__")


def local(module: str) -> bool:
    return module == "aso.local" or module.startswith("aso.local.")


def test_no_library_module_or_agent_imports_the_development_parts():
    graph = import_graph()
    assert any(target.startswith("aso.local.") for target in graph["aso.supervisor"])  # it looks
    found = {
        (name, target)
        for name, targets in graph.items()
        for target in targets
        if local(target)
        and not local(name)
        and not any(name == entry or name.startswith(entry + ".") for entry in STARTS_LOCAL_PARTS)
    }
    assert found == set()


# The simulator is a back end like the others (issue 19): what tells it apart is in the site
# catalogue (protocol `sim`, aso/sites.py), the configuration's checks, the back ends' factory
# and its own modules; file operations are chosen by URL scheme (aso/files.py).
SIM_KNOWN_TO = {
    "aso/sites.py",
    "aso/config.py",
    "aso/files.py",
    "aso/transfer/__init__.py",
    "aso/transfer/sim.py",
    "aso/cli/sim.py",
    "aso/cli/__init__.py",  # the `aso sim` command's name
}


def sim_tests(path: Path) -> list[str]:
    """String constants naming the simulator ("sim", "sim://...") in a module."""
    return [
        f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}"
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (node.value == "sim" or node.value.startswith("sim://"))
    ]


def test_no_agent_or_core_module_tests_for_the_simulator():
    modules = [*(ROOT / "aso").rglob("*.py"), *(ROOT / "agents").rglob("*.py")]
    found = [
        hit
        for path in modules
        if str(path.relative_to(ROOT)) not in SIM_KNOWN_TO
        for hit in sim_tests(path)
    ]
    assert found == []
    # ...and the check sees one where there is one.
    assert sim_tests(ROOT / "aso" / "transfer" / "__init__.py")


def test_the_independent_status_client_imports_nothing_of_aso():
    """tests/test_status_client.py stands for a client written from docs/status-api.md alone."""
    source = (ROOT / "tests" / "test_status_client.py").read_text()
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            modules.add((node.module or "").split(".")[0])
    assert modules and not modules & {"aso", "agents", "sim", "tests"}, modules


def test_agents_do_not_import_each_other():
    """An agent is a thin loop over aso's functions: what two agents share (the deleter, the
    cleanup decisions) lives in aso/, so that no agent depends on another."""
    graph = import_graph()
    agent_modules = [name for name in graph if name.startswith("aso.agents.")]
    assert len(agent_modules) >= 8
    assert "aso.deleter" in graph["aso.agents.monitor"]  # the walk sees what the agents import
    found = {
        name: sorted(m for m in graph[name] if m.startswith("aso.agents")) for name in agent_modules
    }
    assert {name: hits for name, hits in found.items() if hits} == {}


def imports_of(packages: tuple[str, ...]) -> dict[str, list[str]]:
    """module → every full name it imports (aso/, agents/, sim/, tests/ as asked)."""
    found = {}
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            module = module_of(path)
            found[module] = imported_names(path.read_text(), module)
    return found


def test_only_the_store_package_speaks_to_the_store():
    """The CouchDB client is aso/store/'s alone: everything else goes through its narrow
    interface (aso.store), so that a store quirk is handled in one place."""
    found = imports_of(("aso", "agents", "sim", "tests"))
    client = ("ibmcloudant", "ibm_cloud_sdk_core")
    speaking = {
        module
        for module, names in found.items()
        if any(name.split(".")[0] in client for name in names)
    }
    assert "aso.store.couchapi" in speaking  # the walk sees the client where it is used
    assert {m for m in speaking if not m.startswith("aso.store.")} == set()


# Who administers the store (databases, security, accounts, design documents): set-up and checks.
ADMINISTERS = ("aso.provision.", "aso.local.",
               "aso.cli", "aso.store.")  # fmt: skip


def test_only_set_up_and_checks_administer_the_store():
    found = imports_of(("aso", "agents"))
    admin = {
        module
        for module, names in found.items()
        if any(name == "aso.store.admin" or name.startswith("aso.store.admin.") for name in names)
    }
    assert "aso.provision.designdocs" in admin
    assert {m for m in admin if not m.startswith(ADMINISTERS)} == set()


def package_of(module: str) -> str:
    """A module's part of the service: its package under aso/ (aso.frontend, aso.store, ...),
    the agents, or the module itself when it sits in aso/ alone."""
    parts = module.split(".")
    if len(parts) > 2 or (len(parts) == 2 and (ROOT / "aso" / parts[1]).is_dir()):
        return ".".join(parts[:2])
    return module


def test_the_packages_are_layered():
    """The service's parts (aso/frontend, aso/store, aso/monitoring, aso/provision, aso/local,
    aso/grid, aso/transfer, aso/catalog, aso/core, the agents, the CLI) depend on each other
    one way: no two packages import each other, directly or round a circle."""
    graph: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        mine = package_of(module)
        graph.setdefault(mine, set()).update(
            package_of(t) for t in targets if package_of(t) != mine
        )
    for targets in list(graph.values()):
        for target in targets:
            graph.setdefault(target, set())
    assert {"aso.frontend", "aso.store", "aso.monitoring", "aso.provision", "aso.grid"} <= set(
        graph
    )
    assert "aso.store" in graph["aso.monitoring"]  # the walk sees packages' imports
    assert cycles(graph) == []
