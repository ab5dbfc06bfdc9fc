"""The documentation holds together: a short README whose architecture picture names every agent,
and relative links (README.md, CHANGELOG.md, docs/*.md, deploy/README.md) that lead to files
that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
LINKED = [README, ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKED.append(ROOT / "deploy" / "README.md")

# [text](target) and ![alt](target); a target may carry a "title" after a space.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)


def relative_links(text: str) -> list[str]:
    """Every link target of a markdown text outside code blocks that is a path in the
    repository (no scheme, no pure #anchor), without its #anchor."""
    targets = []
    for target in LINK.findall(FENCE.sub("", text)):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http(s)://, mailto:, ... and anchors within the page
        targets.append(target.split("#", 1)[0])
    return targets


def test_the_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= 220, f"README.md has {len(lines)} lines: move detail into docs/"


@pytest.mark.parametrize("doc", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_to_files_that_exist(doc: Path):
    assert doc.exists(), doc
    broken = [t for t in relative_links(doc.read_text()) if not (doc.parent / t).exists()]
    assert not broken, f"{doc.relative_to(ROOT)} links to missing files: {broken}"


def test_the_link_check_sees_links_and_skips_urls_and_anchors():
    text = (
        "[a](docs/design.md#the-transfer-request) ![b](docs/bench/x.png) [c](https://x.org/y)"
        " [d](#architecture) [e](http://h/) [f](../README.md)\n```\n[g](not/a/link.md)\n```\n"
    )
    assert relative_links(text) == ["docs/design.md", "docs/bench/x.png", "../README.md"]


def architecture_picture() -> str:
    """The first code block of the README's "Architecture" section."""
    text = README.read_text()
    section = re.search(r"^## Architecture\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert section, "README.md has no Architecture section"
    picture = re.search(r"^```[^\n]*\n(.*?)^```", section.group(1), re.MULTILINE | re.DOTALL)
    assert picture, "README.md's Architecture section has no picture"
    return picture.group(1)


def agent_modules() -> list[str]:
    return sorted(p.stem for p in (ROOT / "agents").glob("*.py") if p.name != "__init__.py")


def names(text: str, name: str) -> bool:
    """`name` stands in `text` as a word of its own: "monitor", not "monitoring"."""
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text) is not None


def test_the_architecture_picture_names_every_agent():
    picture = architecture_picture().lower()
    modules = agent_modules()
    assert "submitter" in modules and "gfal_worker" in modules  # the list is the real one
    spellings = {m: {m, m.replace("_", " "), m.replace("_", "-")} for m in modules}
    missing = [m for m in modules if not any(names(picture, s) for s in spellings[m])]
    assert not missing, f"README's architecture picture does not name the agents {missing}"
    assert not names("monitoring pages", "monitor")


# --- every documented command is a command, driven through the CLI by some test -------------
USAGE = ROOT / "docs" / "usage.md"
TESTS = ROOT / "tests"


def documented_commands() -> list[tuple[str, ...]]:
    """The sub-commands of docs/usage.md's command block: `aso store start|stop|status` is
    three; the words before the first option or placeholder."""
    block = FENCE.search(USAGE.read_text())
    assert block is not None
    commands: list[tuple[str, ...]] = []
    for line in block.group(0).splitlines():
        if not line.startswith("aso "):
            continue
        words: list[list[str]] = []
        for word in line.split("#")[0].split()[1:]:
            if not re.fullmatch(r"[a-z][a-z-]*(\|[a-z][a-z-]*)*", word):
                break
            words.append(word.split("|"))
        names = [()]
        for choices in words:
            names = [(*name, choice) for name in names for choice in choices]
        commands += [name for name in names if name not in commands]
    return commands


def driven_by_a_test(command: tuple[str, ...], sources: str) -> bool:
    """A test calls the command through the CLI: aso("status", ...), an argv ["aso", "status",
    ...] or a CliRunner's ["status", ...]."""
    quoted = re.escape(", ".join(f'"{w}"' for w in command))
    # aso("run", ...), ["run", ...], [ASO, "run"...], [ASO, "--config", str(path), "run", ...]
    return re.search(rf'(aso\(|\[|"aso", |ASO, |str\(\w+(\.\w+)*\), ){quoted}', sources) is not None


COMMANDS = documented_commands()


def test_the_usage_page_lists_the_commands():
    assert ("publish",) in COMMANDS and ("store", "status") in COMMANDS and len(COMMANDS) > 25


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_documented_command_exists_and_a_test_drives_it(command: tuple[str, ...]):
    from typer.testing import CliRunner

    from aso.cli import app

    shown = CliRunner().invoke(app, [*command, "--help"])
    assert shown.exit_code == 0, shown.output
    sources = "\n".join(p.read_text() for p in sorted(TESTS.glob("test_*.py")))
    assert driven_by_a_test(command, sources), f"no test runs `aso {' '.join(command)}`"


def test_the_driven_check_sees_a_call_and_its_absence():
    assert driven_by_a_test(("publish",), 'x = aso("publish", "--retry", task)')
    assert driven_by_a_test(("run",), '[ASO, "--config", str(config.source), "run"]')
    assert driven_by_a_test(("store", "start"), 'run(["store", "start"])')
    assert not driven_by_a_test(("catalog", "ls"), 'aso("catalog", "blocks", d)')


ROUTES_BEGIN = "<!-- routes: generated by `python -m aso.frontend.openapi --routes` -->\n"
ROUTES_END = "<!-- end of routes -->"


def test_the_security_page_s_route_table_is_the_front_end_s():
    """docs/security.md's route tables are what the front end serves (aso/frontend/routes.py): the
    documented model and the gate are one table."""
    from aso.frontend import openapi  # the generator reads the design documents: not at collection

    text = (ROOT / "docs" / "security.md").read_text()
    assert ROUTES_BEGIN in text and ROUTES_END in text
    written = text.split(ROUTES_BEGIN, 1)[1].split(ROUTES_END, 1)[0]
    assert written == openapi.route_table(), (
        "run: python -m aso.frontend.openapi --routes (docs/security.md)"
    )
    assert "| DELETE | `/asynctransfer/{doc_id}` | agent, operator |" in written


def test_the_published_openapi_document_is_the_front_end_s():
    """docs/openapi.yaml is what the generator makes of the model and the routes (a field added
    to a hold was missing from it)."""
    from aso.frontend import openapi

    written = (ROOT / "docs" / "openapi.yaml").read_text()
    assert written == openapi.render(), "run: python -m aso.frontend.openapi > docs/openapi.yaml"


QUIRK = re.compile(r"\b(?:EMBEDDED|COUCHDB|CLUSTER)_[A-Z0-9_]{3,}\b")
# Names of that shape that are the code's own constants or environment variables, not quirks.
NOT_QUIRKS = {"COUCHDB_HOME", "COUCHDB_ARGS_FILE", "COUCHDB_INI_FILES", "CLUSTER_FETCH_NODES",
              "EMBEDDED_WARNINGS"}  # fmt: skip


def test_every_store_quirk_is_listed_and_named_where_it_is_handled():
    """docs/store-quirks.md lists each quirk once; the code names it where it handles it, and
    names no quirk the list lacks."""
    listed = re.findall(r"^- \*\*`([A-Z0-9_]+)`\*\*", (ROOT / "docs/store-quirks.md").read_text(),
                        re.M)  # fmt: skip
    assert len(listed) > 60 and len(set(listed)) == len(listed)
    code = [
        path.read_text()
        for folder in ("aso", "agents", "deploy", "couchapp")
        for path in (ROOT / folder).rglob("*")
        if path.suffix in (".py", ".js", ".sh")
        and path.is_file()
        and "node_modules" not in path.parts
    ]
    named = {name for text in code for name in QUIRK.findall(text)}
    assert sorted(set(listed) - named) == []  # listed, handled nowhere
    assert sorted(named - set(listed) - NOT_QUIRKS) == []  # handled, not listed
