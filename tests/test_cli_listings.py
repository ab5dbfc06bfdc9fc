"""Every `aso` listing as scripts read it: the real executable with its output to a pipe at the
terminal width nobody set (no COLUMNS: rich assumes 80 columns off a terminal), with and
without --json, and cut by --limit/--all with its "N more" line.

The data has values wider than 80 columns (a long task name, LFNs, a dataset, block names, a
data directory), so a table cut at the width (`T2_C…`) or a line wrapped onto the next shows.
One module-wide world on the store under test: a task the agents (sim back end) copy, clean and
publish into the embedded catalog, so that status, catalog and statistics have rows; a second
task left `new`, which the reconciler (stuck_after tiny) reports as stuck."""

from __future__ import annotations

import dataclasses
import json
import os
import pty
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from aso import model
from aso.agents.cleaner import Cleaner
from aso.agents.monitor import Monitor
from aso.agents.publisher import Publisher
from aso.agents.retry_manager import RetryManager
from aso.agents.submitter import Submitter
from aso.cli.common import shown
from aso.config import Config, load, render
from aso.model import OWNER, Change
from aso.provision.designdocs import init_databases
from aso.runtime import Runner
from aso.sites import simulated
from aso.store import Server
from aso.store import admin as store_admin
from tests.conftest import PASSWORD, SIM_SITES, sample_request, write_config
from tests.pipeline_helpers import run_until
from tests.test_cli import ASO

LONG = "a_rather_long_processed_dataset_name_for_wide_columns_" * 2  # 108 characters
TASK = f"261125_130000:alice_{LONG}"[:200]
WAITING_TASK = f"261125_130001:alice_{LONG}"[:200]
DATASET = f"/Prim_{LONG}/alice-{LONG}-v1/USER"
LINKS = [("T2_CH_CERN", "T2_DE_DESY"), ("T2_IT_Pisa", "T2_DE_DESY")]
FILES = 8  # two blocks of 4
MORE = "more: --limit N, or --all"


@dataclass(frozen=True)
class World:
    config: Config
    path: Path  # the config file
    ids: list[str]  # the published task's requests
    lfns: list[str]  # their source LFNs
    blocks: list[str]


def _config(store_config: Config, base: Path) -> Config:
    suffix = uuid.uuid4().hex[:8]
    return dataclasses.replace(
        store_config,
        source=base / "aso.toml",
        store=dataclasses.replace(
            store_config.store, files_db=f"files_{suffix}", transfers_db=f"jobs_{suffix}",
            pages_db=f"pages_{suffix}", catalog_db=f"catalog_{suffix}",
            stats_db=f"stats_{suffix}", user="alice", password=PASSWORD,
        ),
        transfer=dataclasses.replace(store_config.transfer, backend="sim", lease=4.0),
        sites=simulated(SIM_SITES),
        sim=dataclasses.replace(store_config.sim, mean_duration=0.3, distribution="fixed"),
        agents=dataclasses.replace(store_config.agents, poll_interval=0.2,
                                   heartbeat_interval=0.5, heartbeat_expiry=3.0),
        publisher=dataclasses.replace(store_config.publisher, max_files_per_block=4,
                                      base_delay=0.1),
        reconciler=dataclasses.replace(store_config.reconciler, stuck_after=0.001),
    )  # fmt: skip


def _request(task: str, n: int, publish: bool) -> dict[str, object]:
    source, destination = LINKS[n % len(LINKS)]
    path = f"{LONG}/0000/out_{n}.root"
    extra: dict[str, object] = {"publish": publish}
    if publish:
        extra["publish_info"] = {"dataset": DATASET, "events": 10}
    return sample_request(
        "alice", task=task, job_id=str(n + 1), source=source, destination=destination,
        source_lfn=f"/store/temp/user/alice.abc/{task[:13]}/{path}",
        destination_lfn=f"/store/user/alice/{task[:13]}/{path}", **extra,
    )  # fmt: skip


@pytest.fixture(scope="module")
def world(
    store_config: Config,
    admin: Server,
    accounts: dict[str, Server],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[World]:
    config = _config(store_config, tmp_path_factory.mktemp("listings"))
    init_databases(admin, config)
    path = write_config(config)
    owner = accounts["alice"].db(config.store.files_db)
    docs = [_request(TASK, n, publish=True) for n in range(FILES)]
    assert all(r.ok for r in owner.bulk_write(docs))
    ids = [str(d["_id"]) for d in docs]
    db = admin.db(config.store.files_db)
    runners = [Runner(agent) for agent in (
        Submitter(config, "s1"), Monitor(config, "m1"), RetryManager(config, "r1"),
        Cleaner(config, "c1"), Publisher(config, "p1"),
    )]  # fmt: skip
    try:
        # The waiting task's files stay `new`: only the published task's are let through.
        run_until(lambda: all(model.has_ended(d) for d in db.get_many(ids).values()), runners, 120)
    finally:
        for runner in runners:
            runner.agent.close()
    # Recorded once the agents are gone: these stay `new`, stuck for the reconciler.
    waiting = [_request(WAITING_TASK, n, publish=False) for n in range(3)]
    assert all(r.ok for r in owner.bulk_write(waiting))
    blocks = sorted({str(d["publication_block"]) for d in db.get_many(ids).values()})
    assert len(blocks) == 2
    yield World(config, path, ids, [str(d["source_lfn"]) for d in docs], blocks)
    for name in ("files_db", "transfers_db", "pages_db", "catalog_db", "stats_db"):
        store_admin.delete_db(admin, getattr(config.store, name))


def piped(*args: str, config: Path) -> subprocess.CompletedProcess[str]:
    """`aso` as a script runs it: output to a pipe, and no COLUMNS to widen rich's 80."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "ASO_CONFIG")}
    return subprocess.run([ASO, "--config", str(config), *args], capture_output=True, text=True,
                          timeout=120, env=env)  # fmt: skip


@dataclass(frozen=True)
class Listing:
    """A listing command: its arguments, its table's header (its first columns), where its
    rows are in its JSON ("": the JSON is the list), and values wider than a table shows."""

    args: Callable[[World], list[str]]
    header: str
    rows: str
    whole: Callable[[World], list[str]]
    code: int = 0
    extra: int = 0  # table rows besides the listed ones (a total)


LISTINGS = {
    "request list --task": Listing(
        lambda w: ["request", "list", "--task", TASK], "id\ttask\tjob", "requests",
        lambda w: [TASK]),
    "request list --state": Listing(
        lambda w: ["request", "list", "--state", "new"], "id\ttask\tjob", "requests",
        lambda w: [WAITING_TASK]),
    "status TASK": Listing(
        lambda w: ["status", TASK], "id\tjob\ttype", "files", lambda w: w.lfns),
    "status --since": Listing(
        lambda w: ["status", TASK, "--since", "0"], "id\tjob\ttype", "files",
        lambda w: w.lfns),
    "status --file": Listing(
        lambda w: ["status", "--file", w.ids[0]], "time (UTC)\twhat\tdetail", "events",
        lambda w: [w.lfns[0]]),
    "catalog ls": Listing(
        lambda w: ["catalog", "ls", DATASET], "lfn\tsize", "",
        lambda w: [lfn.replace("/store/temp/user/alice.abc/", "/store/user/alice/")
                   for lfn in w.lfns] + [DATASET]),
    "catalog blocks": Listing(
        lambda w: ["catalog", "blocks", DATASET], "block\tfiles", "",
        lambda w: [*w.blocks, DATASET]),
    "stats": Listing(
        lambda w: ["stats", "--by", "link"], "day\tlink\tdone", "rows",
        lambda w: ["T2_CH_CERN", "T2_IT_Pisa"], extra=1),
    "reconcile": Listing(
        lambda w: ["reconcile", "--kind", "stuck"], "request / block\tpath", "findings",
        lambda w: [], code=1),
}  # fmt: skip


def tables(stdout: str) -> dict[str, list[list[str]]]:
    """The tab-separated tables of an output, by header line. Each line of a table has the
    header's number of cells: nothing wrapped onto a line of its own."""
    found: dict[str, list[list[str]]] = {}
    header = None
    for line in stdout.splitlines():
        if "\t" not in line:
            header = None
        elif header is None:
            header = line
            found[header] = []
        else:
            cells = line.split("\t")
            assert len(cells) == header.count("\t") + 1, (header, line)
            found[header].append(cells)
    return found


def table_rows(stdout: str, header: str) -> list[list[str]]:
    [rows] = [rows for line, rows in tables(stdout).items() if line.startswith(header)]
    return rows


def json_rows(listing: Listing, data: Any) -> list[Any]:
    return list(data[listing.rows] if listing.rows else data)


def assert_whole(output: str, values: list[str]) -> None:
    """Each value on one line, whole: not cut with an ellipsis, not wrapped."""
    assert "…" not in output
    lines = output.splitlines()
    for value in values:
        assert any(value in line for line in lines), value


@pytest.mark.parametrize("name", LISTINGS)
def test_a_listing_on_a_pipe_is_whole_at_the_default_width(world, name):
    listing = LISTINGS[name]
    as_json = piped(*listing.args(world), "--json", config=world.path)
    assert as_json.returncode == listing.code, as_json.stderr
    data = json.loads(as_json.stdout)
    total = len(json_rows(listing, data))
    assert total > 1 and MORE not in as_json.stderr  # JSON is whole unless --limit is given
    assert all(v in json.dumps(data) for v in listing.whole(world))
    if listing.rows:
        assert data["total"] == total
    text = piped(*listing.args(world), "--all", config=world.path)
    assert text.returncode == listing.code, text.stderr
    assert len(table_rows(text.stdout, listing.header)) == total + listing.extra
    assert_whole(text.stdout, listing.whole(world))
    assert MORE not in text.stdout


@pytest.mark.parametrize("name", LISTINGS)
def test_a_listing_cut_by_limit_says_how_many_more(world, name):
    listing = LISTINGS[name]
    total = len(json_rows(listing, json.loads(
        piped(*listing.args(world), "--json", config=world.path).stdout)))  # fmt: skip
    cut = piped(*listing.args(world), "--limit", "1", config=world.path)
    assert cut.returncode == listing.code, cut.stderr
    assert len(table_rows(cut.stdout, listing.header)) == 1 + listing.extra
    assert f"{total - 1} {MORE}" in cut.stdout.splitlines()
    cut_json = piped(*listing.args(world), "--limit", "1", "--json", config=world.path)
    data = json.loads(cut_json.stdout)  # the line about the rest is not in the JSON
    assert len(json_rows(listing, data)) == 1 and f"{total - 1} {MORE}" in cut_json.stderr
    if listing.rows:
        assert data["total"] == total


def test_a_table_stops_at_fifty_rows_by_default(world, accounts):
    """Without --limit a table shows 50 rows and says how many more; --json shows them all."""
    task = f"261125_130002:alice_{LONG}"[:200]
    docs = [dict(sample_request("alice", task=task, job_id=str(n))) for n in range(1, 61)]
    assert all(r.ok for r in accounts["alice"].db(world.config.store.files_db).bulk_write(docs))
    text = piped("status", task, config=world.path)
    assert len(table_rows(text.stdout, "id\tjob\ttype")) == 50
    assert f"10 {MORE}" in text.stdout.splitlines()
    assert len(json.loads(piped("status", task, "--json", config=world.path).stdout)["files"]) == 60


# The other commands whose output scripts read: one document or a line per item.
def test_store_check_on_a_pipe_is_tab_separated(world):
    """`aso store check` drew a box table whatever the output: off a terminal it is
    tab-separated with a header like every listing, each detail whole."""
    text = piped("store", "check", config=world.path)
    assert text.returncode in (0, 1), text.stderr  # a test store may have warnings or errors
    assert not set("┏┃│└") & set(text.stdout) and "…" not in text.stdout
    rows = table_rows(text.stdout, "level\titem\tdetail")
    report = json.loads(piped("store", "check", "--json", config=world.path).stdout)
    findings = report["findings"]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (f["level"], f["item"], f["detail"]) for f in findings
    ]
    assert text.stdout.splitlines()[-1].endswith(" ok")


def test_store_and_storage_status_on_a_pipe_and_as_json(world):
    store = piped("store", "status", config=world.path)
    assert store.returncode == 0, store.stderr
    as_json = json.loads(piped("store", "status", "--json", config=world.path).stdout)
    assert as_json["engine"] == world.config.store.engine
    [node] = as_json["nodes"]
    assert node["answering"] is True and node["url"] == world.config.store.url
    assert node["data_dir"].startswith(str(world.config.path(world.config.embedded.data_dir)))
    assert isinstance(node["pid"], int)
    assert_whole(store.stdout, [node["data_dir"], world.config.store.url])
    assert len(store.stdout.splitlines()) == 1

    storage = piped("storage", "status", config=world.path)
    assert storage.returncode == 0, storage.stderr
    assert len(storage.stdout.splitlines()) == len(world.config.sites)
    sites = json.loads(piped("storage", "status", "--json", config=world.path).stdout)["sites"]
    assert sorted(s["site"] for s in sites) == sorted(world.config.sites)
    assert all(s["embedded"] is False and s["answering"] is None for s in sites)


def test_config_keys_and_show_on_a_pipe_are_whole(world, tmp_path):
    keys = piped("config", "keys", config=world.path)
    rows = table_rows(keys.stdout, "key\tdefault\tmeaning")
    described = json.loads(piped("config", "keys", "--json", config=world.path).stdout)
    assert [r[0] for r in rows] == [d["key"] for d in described]
    assert_whole(keys.stdout, [d["meaning"] for d in described])
    embedded = dataclasses.replace(world.config.embedded, data_dir=str(tmp_path / LONG))
    path = write_config(dataclasses.replace(world.config, source=tmp_path / "long.toml",
                                            embedded=embedded))  # fmt: skip
    shown = piped("config", "show", config=path)
    rendered = render(load(str(path))).splitlines()
    assert any(len(line) > 80 for line in rendered)  # the long ones come out whole
    assert_whole(shown.stdout, [line for line in rendered if line.strip()])


HOSTILE = (
    "\x1b[2J\x1b]0;owned\x07\x1b]52;c;ZWNobyBwd25lZA==\x07[red]operator: run this[/red] [/bold] "
    "\u202etxt.exe \x9b2J\x9d0;c1\x07 a\u200bb\u2060c\u2028d\u2029e"
)
# What a terminal acts on or shows as nothing, of HOSTILE: none of it may reach one raw.
RAW = ("\x1b]52", "\x1b]0;", "\x1b[2J", "\u202e", "\x9b", "\x9d", "\u200b", "\u2060", "\u2028",
       "\u2029")  # fmt: skip


def on_a_terminal(*args: str, config: Any) -> str:
    """What `aso ARGS` writes to a (pseudo-)terminal."""
    primary, secondary = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("ASO_CONFIG",)}
    env.update(COLUMNS="400", TERM="xterm-256color")
    argv = [ASO, "--config", str(config), *args]
    run = subprocess.run(argv, stdout=secondary, stderr=subprocess.PIPE, timeout=120, env=env)
    os.close(secondary)
    out = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.close(primary)
    assert run.returncode == 0, run.stderr
    return out.decode(errors="replace")


def test_what_a_user_wrote_is_shown_never_acted_on_by_a_terminal(world, accounts):
    """Red team round 27: a reason alice wrote in her own request's history (a kill's) went raw to
    the terminal of whoever ran `aso status --file` on it: it cleared the screen, set the title
    and the clipboard (OSC 52), forged red text as rich markup, and an unbalanced tag crashed
    the command. Listings show control, format and separator characters as visible escapes
    and never parse a value as markup, on a pipe and on a terminal; JSON escapes all but
    ASCII (round 28)."""
    owner = accounts["alice"].db(world.config.store.files_db)
    doc = sample_request("alice", task="261125_130003:alice_hostile", job_id="1")
    doc["_rev"] = owner.create(doc)
    owner.put(model.transition(doc, [Change(model.STATE, "killed", "alice", HOSTILE)], OWNER))
    escaped = shown(HOSTILE)
    assert "\x1b" not in escaped and "\\x1b]52;c;" in escaped and "\\u202e" in escaped
    assert [c for c in RAW if c in escaped] == [] and "\\u200b" in escaped
    on_a_pipe = piped("status", "--file", doc["_id"], config=world.path)
    assert on_a_pipe.returncode == 0, on_a_pipe.stderr
    assert escaped in on_a_pipe.stdout and "\x1b" not in on_a_pipe.stdout
    # On a terminal (a pseudo-terminal): rich draws the table; nothing of hers is acted on,
    # in the table nor as JSON (round 28: --json and `request show` passed C1 controls,
    # text-reordering marks and separators raw).
    for args in (["status", "--file", doc["_id"], "--json"], ["request", "show", doc["_id"]]):
        raw = on_a_terminal(*args, config=world.path)
        assert [c for c in RAW if c in raw] == [], args
        assert "\\u202e" in raw, args
    text = on_a_terminal("status", "--file", doc["_id"], config=world.path)
    for acted_on in RAW:
        assert acted_on not in text, acted_on
    assert "[red]operator: run this[/red]" in text.replace("\r\n", "").replace("\n", "")
