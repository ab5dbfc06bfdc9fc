"""The `aso` command: one entry point, a sub-command per job, `--help` everywhere.

Errors that are the user's or the environment's (bad config, unreachable store, refused
document) end in one line on stderr and a non-zero exit code, never a traceback:
1 = the operation failed, 2 = bad usage or configuration.

The CLI is the top layer: this module holds the app, its everyday commands and `main` (the
console script); the larger command groups have a module each in this package (catalog.py,
frontend.py, metrics.py, reconcile.py, sim.py, stats.py, status.py, storage.py, storecheck.py),
sharing common.py. No library module of aso/ and nothing in sim/ imports the CLI
(tests/test_layout.py).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import Progress

# Typer vendors click (typer._click) and re-exports none of its exceptions but Abort and Exit;
# a usage error (unknown command or option, a bad value) is click's ClickException.
from typer._click.exceptions import ClickException

from aso import config as aso_config
from aso import model
from aso.agents import AGENTS, agent_class
from aso.cli.catalog import catalog_app
from aso.cli.common import (
    BUILT_IN_DEFAULTS,
    EXIT_RETRYABLE,
    NO_CONFIG_HINT,
    AllOpt,
    LimitOpt,
    NotFound,
    UsageError,
    acting_name,
    line_console,
    print_json,
    print_more,
    print_table,
    resolve_id,
    row_limit,
)
from aso.cli.common import config_of as _config
from aso.cli.controls import site_app, user_app
from aso.cli.frontend import certs_app, frontend_cmd
from aso.cli.holds import hold_app
from aso.cli.metrics import metrics_app
from aso.cli.notify import notify_app
from aso.cli.reconcile import reconcile_cmd
from aso.cli.sim import sim_cmd
from aso.cli.stats import stats_cmd
from aso.cli.status import status_cmd
from aso.cli.storage import storage_app
from aso.cli.storecheck import store_check_cmd
from aso.config import ConfigError
from aso.grid.gridenv import CredentialError
from aso.local.couchdb import join_cluster
from aso.local.managed import local_store
from aso.local.stores import LocalCluster, LocalStoreError
from aso.local.xrootd import StorageError
from aso.monitoring import queries
from aso.provision import migrate as migration
from aso.provision.designdocs import init_databases
from aso.runtime import Runner
from aso.store import Database, Server, StoreError, redact
from aso.store import admin as store_admin
from aso.supervisor import Supervisor, pages_addresses
from aso.upload import UploadReport, adler32_of, judged_request, requests_from_json, upload

console = line_console()
err_console = line_console(stderr=True)

# `aso --help` groups the commands by who uses them.
USERS = "For users and clients"
OPERATORS = "For operators"
SERVICES = "The service's processes, the demo and the simulator"

app = typer.Typer(
    help="ASO (AsyncStageOut): asynchronous stage-out of grid analysis outputs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
config_app = typer.Typer(help="Show or create the configuration file.", no_args_is_help=True)
store_app = typer.Typer(
    help="The document store: run the local one (pouchdb-server or CouchDB), check any CouchDB.",
    no_args_is_help=True,
)
db_app = typer.Typer(help="Databases, design documents and store accounts.", no_args_is_help=True)
request_app = typer.Typer(help="Look at transfer requests.", no_args_is_help=True)
# Users' commands first: the panels come in the order of their first command.
app.command("status", rich_help_panel=USERS)(status_cmd)
app.add_typer(request_app, name="request", rich_help_panel=USERS)
app.add_typer(hold_app, name="hold", rich_help_panel=USERS)
app.add_typer(notify_app, name="notify", rich_help_panel=USERS)
app.add_typer(config_app, name="config", rich_help_panel=OPERATORS)
app.add_typer(store_app, name="store", rich_help_panel=OPERATORS)
store_app.command("check")(store_check_cmd)
app.add_typer(db_app, name="db", rich_help_panel=OPERATORS)
app.add_typer(storage_app, name="storage", rich_help_panel=OPERATORS)
app.add_typer(catalog_app, name="catalog", rich_help_panel=OPERATORS)
app.add_typer(site_app, name="site", rich_help_panel=OPERATORS)
app.add_typer(user_app, name="user", rich_help_panel=OPERATORS)
app.command("reconcile", rich_help_panel=OPERATORS)(reconcile_cmd)
app.command("stats", rich_help_panel=OPERATORS)(stats_cmd)
app.command("sim", rich_help_panel=SERVICES)(sim_cmd)
app.command("frontend", rich_help_panel=SERVICES)(frontend_cmd)
app.add_typer(certs_app, name="certs", rich_help_panel=OPERATORS)
app.add_typer(metrics_app, name="metrics", rich_help_panel=OPERATORS)


def _server(ctx: typer.Context, account: str = "user") -> Server:
    return Server.from_config(_config(ctx), account=account)


def _files_db(ctx: typer.Context) -> Database:
    return _server(ctx).db(_config(ctx).store.files_db)


def _me(ctx: typer.Context) -> str:
    return acting_name(_config(ctx), _server(ctx))


@app.callback()
def main_options(
    ctx: typer.Context,
    config_file: Annotated[
        str | None,
        typer.Option(
            "--config",
            "-c",
            help="Config file (default: $ASO_CONFIG, ./aso.toml, "
            "~/.config/aso/aso.toml, /etc/aso/aso.toml).",
            show_default=False,
        ),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at DEBUG level.")] = False,
) -> None:
    ctx.obj = {"config_file": config_file, "verbose": verbose}


# --- config ----------------------------------------------------------------------------------
@config_app.command("show")
def config_show(
    ctx: typer.Context,
    secrets: Annotated[bool, typer.Option("--secrets", help="Show passwords too.")] = False,
) -> None:
    """Print the effective configuration (file values over defaults) as TOML."""
    config = _config(ctx)
    source = config.source or "no file: built-in defaults"
    console.print(f"# effective configuration ({source})", markup=False, highlight=False)
    console.print(aso_config.render(config, show_secrets=secrets), markup=False, highlight=False)


@config_app.command("keys")
def config_keys(
    markdown: Annotated[
        bool, typer.Option("--markdown", help="As docs/configuration.md's table.")
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the keys as JSON.")] = False,
) -> None:
    """List every configuration key with its default and meaning."""
    if markdown:
        print(aso_config.markdown_table())
        return
    keys = aso_config.describe()
    if json_out:
        described = [{"key": k, "default": d, "meaning": m} for k, d, m in keys]
        print(json.dumps(described, indent=2))
        return
    print_table(("key", "default", "meaning"), [(k, json.dumps(d), m) for k, d, m in keys])


@config_app.command("init")
def config_init(
    path: Annotated[Path, typer.Argument(help="Where to write the file.")] = Path("aso.toml"),
    if_missing: Annotated[
        bool, typer.Option("--if-missing", help="Do nothing (exit 0) if the file exists.")
    ] = False,
) -> None:
    """Write a config file with the defaults and freshly generated store passwords."""
    if path.exists():
        if if_missing:
            console.print(f"{path} exists; left as it is")
            return
        raise UsageError(f"{path} exists; remove it first or use --if-missing")
    aso_config.write_new_config(path)
    console.print(f"wrote {path} (mode 0600: it holds the store passwords)")
    certs = path.parent / "certs"
    if not certs.exists():
        from aso.local import pki

        pki.demo(certs, ["alice", "bob"])
        console.print(
            f"wrote a throw-away PKI for the front end in {certs} (as `aso certs demo` does)"
        )


# --- the local store ---------------------------------------------------------------------
@store_app.command("start")
def store_start(
    ctx: typer.Context,
    foreground: Annotated[
        bool,
        typer.Option(
            "--foreground",
            help="Become the store's server (exec) and serve until stopped, for a service "
            "manager (deploy/systemd/aso-store.service).",
        ),
    ] = False,
    nodes: Annotated[
        int | None,
        typer.Option(
            "--nodes",
            min=1,
            max=9,
            help="store.engine = couchdb: nodes of a new store (a cluster on loopback: node i "
            "on store.url's port + i - 1); default couchdb.nodes.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Start the local store (store.engine: pouchdb-server, or Apache CouchDB from
    couchdb.home) on the loopback address of store.url, data in embedded.data_dir."""
    store = local_store(_config(ctx), nodes=nodes)
    if foreground:
        store.serve()  # does not return
    console.print(store.start())


@store_app.command("stop")
def store_stop(ctx: typer.Context) -> None:
    """Stop the local store started from this config (and no other process)."""
    console.print(local_store(_config(ctx)).stop())


@store_app.command("status")
def store_status(
    ctx: typer.Context,
    json_out: Annotated[bool, typer.Option("--json", help="Print the nodes as JSON.")] = False,
) -> None:
    """Say whether the local store (each node of a cluster) runs and answers; exit 1 if one
    does not answer."""
    store = local_store(_config(ctx))
    statuses = store.statuses() if isinstance(store, LocalCluster) else [store.status()]
    if json_out:
        nodes = [
            {"name": s.name or None, "url": s.url, "answering": s.answering, "pid": s.pid,
             "data_dir": str(s.data_dir)}
            for s in statuses
        ]  # fmt: skip
        print_json(console, {"engine": store.engine, "nodes": nodes})
    else:
        for status in statuses:
            pid = f"pid {status.pid}" if status.pid else "not started by this config"
            state = "answering" if status.answering else "not answering"
            name = f"{status.name} " if status.name else ""
            console.print(
                f"{name}{status.url}: {state} ({store.engine}, {pid}; data in {status.data_dir})",
                markup=False,
                highlight=False,
            )
    if not all(status.answering for status in statuses):
        raise typer.Exit(1)


@store_app.command("setup-cluster")
def store_setup_cluster(
    ctx: typer.Context,
    nodes: Annotated[
        list[str],
        typer.Argument(
            help="The other nodes: Erlang node names (couchdb@couch2.example.org), or hosts "
            "(couchdb@HOST, the name deploy/couchdb/vm.args.notes gives).",
            show_default=False,
        ),
    ],
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait for every node to be connected.")
    ] = 120.0,
) -> None:
    """Join CouchDB nodes into one cluster from the node at store.url (deploy/README.md,
    "A CouchDB cluster"): each node must already run with the same admin, secret and Erlang
    cookie. Adds the nodes, waits until all are connected, creates the system databases.
    Idempotent. Then `aso db init` (the files database gets store.files_q shards)."""
    names = [name if "@" in name else f"couchdb@{name}" for name in nodes]
    admin = _server(ctx, "admin")
    for line in join_cluster(admin, names, timeout=timeout):
        console.print(line)
    membership = store_admin.membership(admin)
    console.print(f"cluster nodes: {', '.join(membership.get('cluster_nodes', []))}")


# --- databases -------------------------------------------------------------------------------
@db_app.command("init")
def db_init(ctx: typer.Context) -> None:
    """Create the databases, push the design documents, set _security, create the agent
    account. Idempotent: run it after every upgrade."""
    config = _config(ctx)
    report = init_databases(_server(ctx, "admin"), config)
    for line in report.lines():
        console.print(line)
    console.print(f"database {config.store.files_db} ready at {redact(config.store.url)}")


@db_app.command("migrate")
def db_migrate(ctx: typer.Context) -> None:
    """Rewrite, once, the documents still in a state only earlier versions of 0.1.0 wrote
    (`acquired`, `publishing`) as today's equivalent, with the admin account. Idempotent: run
    it after `aso db init` when upgrading a store such versions wrote."""
    config = _config(ctx)
    db = _server(ctx, "admin").db(config.store.files_db)
    ids = migration.candidates(db)
    service = config.transfer.backend
    if len(ids) <= migration.PAGE:
        report = migration.migrate(db, service, ids)
    else:
        with Progress(console=console, transient=True) as progress:
            bar = progress.add_task("documents migrated", total=len(ids))
            report = migration.migrate(db, service, ids, advance=lambda n: progress.advance(bar, n))
    if not report.written and not report.refused:
        console.print("nothing to migrate")
        return
    for outcome in migration.OUTCOMES:
        if report.counts[outcome]:
            console.print(f"{report.counts[outcome]} {outcome}")
    console.print(f"{report.written} documents migrated")
    for doc_id, why in report.refused.items():
        err_console.print(f"not migrated {doc_id}: {why}", markup=False)
    if report.refused:
        raise typer.Exit(1)


@db_app.command("add-user")
def db_add_user(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Account name (the `user` of its requests).")],
    password: Annotated[
        str, typer.Option(prompt=True, hide_input=True, help="Password (prompted if not given).")
    ],
    role: Annotated[
        list[str] | None,
        typer.Option(
            "--role", help="Role: aso-user (default), aso-agent or aso-admin; repeatable."
        ),
    ] = None,
) -> None:
    """Create or update a store account (embedded store, or CouchDB without the front end)."""
    roles = role or [model.USER_ROLE]
    allowed = {model.USER_ROLE, model.AGENT_ROLE, "aso-admin"}
    if not set(roles) <= allowed:
        raise UsageError(f"unknown role(s) {sorted(set(roles) - allowed)}; use {sorted(allowed)}")
    changed = store_admin.put_user(_server(ctx, "admin"), name, password, roles)
    console.print(f"account {name} {'written' if changed else 'unchanged'} with roles {roles}")


# --- requests --------------------------------------------------------------------------------
@app.command("upload", rich_help_panel=USERS)
def upload_cmd(
    ctx: typer.Context,
    file: Annotated[
        Path | None,
        typer.Option(
            "--file", "-f", help="JSON file: a list of requests (keys as the options below)."
        ),
    ] = None,
    user: Annotated[str | None, typer.Option(help="Owner (default: the store account).")] = None,
    task: Annotated[str | None, typer.Option(help="Task name.")] = None,
    job_id: Annotated[str | None, typer.Option(help="Job id within the task.")] = None,
    source: Annotated[str | None, typer.Option(help="Source site, e.g. T2_CH_CERN.")] = None,
    destination: Annotated[str | None, typer.Option(help="Destination site.")] = None,
    source_lfn: Annotated[str | None, typer.Option(help="LFN in the source temp area.")] = None,
    destination_lfn: Annotated[str | None, typer.Option(help="LFN at the destination.")] = None,
    size: Annotated[int | None, typer.Option(help="Size in bytes.")] = None,
    adler32: Annotated[str | None, typer.Option(help="Adler-32 checksum, hex.")] = None,
    local_file: Annotated[
        Path | None,
        typer.Option(help="The file as the job has it: size and adler32 are read from it."),
    ] = None,
    file_type: Annotated[str, typer.Option(help="output or log.")] = "output",
    write: Annotated[
        bool,
        typer.Option(
            "--write",
            help="First write --local-file at --source, --source-lfn, with your own proxy"
            " (store.x509_*, else $X509_USER_PROXY...), as a job writes its output.",
        ),
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Record transfer requests (the job wrapper's stage-out step). Idempotent: uploading the
    same file again reports it as already recorded."""
    if write and (file is not None or local_file is None):
        raise UsageError("--write writes --local-file: give it, and the request by options")
    owner = user or _me(ctx)
    if file is not None:
        try:
            docs = requests_from_json(file, default_user=owner)
        except model.ModelError as exc:
            raise UsageError(str(exc)) from None  # the file is bad usage: exit 2
    else:
        values: dict[str, Any] = {
            "task": task,
            "job_id": job_id,
            "source": source,
            "destination": destination,
            "source_lfn": source_lfn,
            "destination_lfn": destination_lfn,
            "size": size,
            "adler32": adler32,
        }
        docs = [_request_of_options(owner, file_type, local_file, values)]
    if write and local_file is not None:
        _write_output(ctx, docs[0], local_file)
    report = upload(_files_db(ctx), docs)
    _print_upload(report, json_out)
    if not report.ok:
        raise typer.Exit(1)


def _request_of_options(
    owner: str, file_type: str, local_file: Path | None, values: dict[str, Any]
) -> dict[str, Any]:
    """The request the options describe; size and adler32 read from `local_file` if given."""
    if local_file is not None:
        if not local_file.is_file():
            raise UsageError(f"--local-file {local_file}: no such file")
        values["size"], values["adler32"] = adler32_of(local_file)
    missing = [f"--{k.replace('_', '-')}" for k, v in values.items() if v is None]
    if missing:
        raise UsageError(f"give --file or all of: {', '.join(missing)}")
    return judged_request(user=owner, file_type=file_type, **values)


def _write_output(ctx: typer.Context, doc: dict[str, Any], local_file: Path) -> None:
    """The job's output written at its source site before its request is recorded."""
    from aso import stageout  # gfal2 only for the commands that use it

    config = _config(ctx)  # a refusal (StageOutError, a ValueError) is exit 1
    url = stageout.write_output(
        config, local_file, doc["source"], doc["source_lfn"], doc["checksum"]["adler32"]
    )
    err_console.print(f"wrote {url}", markup=False)


def _print_upload(report: UploadReport, json_out: bool) -> None:
    if json_out:
        print_json(
            console,
            data={
                "recorded": report.recorded,
                "already": report.already,
                "renewed": report.renewed,
                "refused": report.refused,
            },
        )
        return
    renewed = f", {len(report.renewed)} renewed by a job retry" if report.renewed else ""
    console.print(
        f"{len(report.recorded)} recorded, {len(report.already)} already recorded{renewed},"
        f" {len(report.refused)} refused"
    )
    for doc_id, reason in report.refused.items():
        err_console.print(f"refused {doc_id}: {reason}", markup=False)


@request_app.command("show")
def request_show(
    ctx: typer.Context,
    doc_id: Annotated[str, typer.Argument(help="Request id, or its first 4+ characters.")],
) -> None:
    """Print one request document as JSON."""
    db = _files_db(ctx)
    doc = db.get(resolve_id(db, doc_id))
    if doc is None:
        raise NotFound(f"no request {doc_id}")
    print_json(console, doc)


REQUEST_COLUMNS = ("id", "task", "job", "type", "state", "cleanup", "publication")


@request_app.command("list")
def request_list(
    ctx: typer.Context,
    task: Annotated[str | None, typer.Option(help="Only this task (in job order).")] = None,
    state: Annotated[str | None, typer.Option(help="Only this transfer state.")] = None,
    limit: LimitOpt = None,
    show_all: AllOpt = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
) -> None:
    """List requests of a task (in job order) or in a state; says how many more there are."""
    if state and state not in model.STATES[model.STATE]:
        raise UsageError(f"unknown state {state!r}; one of {', '.join(model.STATES['state'])}")
    db = _files_db(ctx)
    wanted = row_limit(limit, show_all, json_out)
    if task:
        files = [f for f in queries.task_files(db, task) if not state or f.state == state]
        total = len(files)
        rows = [
            dict(id=f.id, task=task, job=f.job_id, type=f.file_type, state=f.state,
                 cleanup=f.cleanup, publication=f.publication)
            for f in files[:wanted]
        ]  # fmt: skip
    else:
        start: list[Any] = [state] if state else []
        end: list[Any] = [state, {}] if state else [{}]
        counted = db.view("asyncstageout", "by_state", start_key=start, end_key=end, reduce=True)
        total = int(counted.rows[0]["value"]) if counted.rows else 0
        result = db.view(
            "asyncstageout", "by_state", start_key=start, end_key=end, limit=wanted,
            reduce=False, include_docs=True,
        )  # fmt: skip
        rows = [
            dict(id=d["_id"], task=d["task"], job=d["job_id"], type=d["file_type"],
                 state=d["state"], cleanup=d["cleanup"], publication=d["publication"])
            for d in result.docs()
        ]  # fmt: skip
    if json_out:
        print_json(console, {"total": total, "requests": rows})
        print_more(total, len(rows), json_out=True)
        return
    print_table(REQUEST_COLUMNS, [[r["id"][:12], *list(r.values())[1:]] for r in rows])
    print_more(total, len(rows))


@app.command("demo", rich_help_panel=SERVICES)
def demo_cmd(
    ctx: typer.Context,
    files: Annotated[int, typer.Option(help="How many files to write and transfer.")] = 200,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for them to end.")] = 600,
    wait: Annotated[bool, typer.Option(help="Follow the transfers until they end.")] = True,
    frontend: Annotated[
        bool | None,
        typer.Option(
            "--frontend/--direct",
            help="Record and follow the requests through the X.509 front end, each user with "
            "a proxy of their own, or straight to the store (default: frontend.enabled).",
        ),
    ] = None,
    freeze: Annotated[
        str | None,
        typer.Option(
            help="An embedded site whose XRootD to freeze (SIGSTOP) during the run, to see the "
            "files wait and complete; the run then says how long each group waited.",
            show_default=False,
        ),
    ] = None,
    freeze_at: Annotated[
        float, typer.Option(help="Seconds after the upload the site is frozen.")
    ] = 10.0,
    freeze_for: Annotated[float, typer.Option(help="Seconds the site stays frozen.")] = 60.0,
) -> None:
    """Write files into two source sites' temp areas, upload their transfer requests for two
    users and follow them (needs `aso run` on the embedded defaults)."""
    from aso.local import demo
    from aso.local.xrootd import EmbeddedStorage, write_file
    from aso.monitoring.queries import all_holds

    config = _config(ctx)
    logging.getLogger("aso.upload").setLevel(logging.WARNING)  # a line per file is noise here
    plan = demo.DemoPlan(files=files)
    missing = [s for s in (*plan.sources, plan.destination) if s not in config.sites]
    if missing:
        raise UsageError(f"the site catalogue lacks {', '.join(missing)}")
    freezer = None
    if freeze is not None:
        storage = EmbeddedStorage(config)
        if freeze not in config.sites or not config.sites[freeze].embedded:
            raise UsageError(f"--freeze: {freeze} is not an embedded site of the catalogue")
        if freeze_at < 0 or freeze_for <= 0:
            raise UsageError("--freeze-at must be 0 or more and --freeze-for above 0")
        freezer = demo.Freeze(freeze, freeze_at, freeze_for, storage.pid_of)
    if frontend is None:
        frontend = config.frontend.enabled
    if frontend:
        dbs = demo.through_frontend(config, plan.users)
        how = f"through the front end at {next(iter(dbs.values())).server.url}"
    else:
        dbs = dict.fromkeys(plan.users, _files_db(ctx))
        how = f"straight to the store at {redact(config.store.url)}"
    db = dbs[plan.users[0]]
    started, started_epoch = time.monotonic(), time.time()
    ids, report = demo.write_and_upload(config, dbs, plan, write_file)
    console.print(
        f"wrote {files} files at {', '.join(plan.sources)}; "
        f"{len(report.recorded)} requests recorded for {', '.join(plan.users)} {how}"
    )
    if not wait:
        return
    try:
        tick = freezer.tick if freezer is not None else None
        counts = demo.follow(db, ids, timeout, console=console, on_tick=tick)
    finally:
        if freezer is not None:
            freezer.thaw()
    elapsed = time.monotonic() - started
    print_table(("state", "files"), [(state, n) for state, n in counts.most_common()])
    if freezer is not None:
        print_table(
            ("files", "count", "done", "p50 s", "p95 s", "longest s"),
            [
                w.row()
                for w in demo.waits([d for d in db.get_many(ids).values() if d], freezer.site)
            ],
            title=f"Seconds from request to copy done, {freezer.site} frozen for "
            f"{freezer.seconds:.0f} s",
        )
        print_table(
            ("at s", "site", "files", "hold", "by: why"),
            demo.hold_changes(all_holds(db), started_epoch),
            title="Holds during the run",
        )
    console.print(
        f"{counts['done']} of {files} done in {elapsed:.1f} s "
        f"({counts['done'] / elapsed:.1f} files/s)"
    )
    for line in pages_addresses(config):  # the analytics agent's summaries follow within 30 s
        console.print(line, soft_wrap=True)
    if counts["done"] != files:
        raise typer.Exit(1)


def _user_action(
    ctx: typer.Context, action: str, task: str, job: str | None, json_out: bool
) -> None:
    from aso.actions import ACTIONS

    report = ACTIONS[action](_files_db(ctx), task, job, _me(ctx))
    if not (report.changed or report.unchanged or report.refused):
        message = f"no requests for task {task}" + (f" job {job}" if job else "")
        if json_out:
            print_json(
                console, data={"changed": {}, "unchanged": {}, "refused": {}, "message": message}
            )
        else:
            console.print(message)
        return
    if json_out:
        print_json(
            console,
            data={
                "changed": report.changed,
                "unchanged": report.unchanged,
                "refused": report.refused,
            },
        )
    else:
        counts: dict[str, int] = {}
        for state in report.changed.values():
            counts[state] = counts.get(state, 0) + 1
        done = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "none changed"
        console.print(
            f"{action}: {done}; {len(report.unchanged)} left as they were "
            f"(nothing to {action}); {len(report.refused)} refused"
        )
        for doc_id, reason in report.refused.items():
            err_console.print(f"refused {doc_id}: {reason}", markup=False)
    if not report.ok:
        raise typer.Exit(1)


@app.command("kill", rich_help_panel=USERS)
def kill_cmd(
    ctx: typer.Context,
    task: Annotated[str, typer.Option(help="Task whose transfers to kill.")],
    job: Annotated[str | None, typer.Option(help="Only this job of the task.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Kill a task's transfers (waiting ones at once, active ones cancelled by the monitor)."""
    _user_action(ctx, "kill", task, job, json_out)


@app.command("resubmit", rich_help_panel=USERS)
def resubmit_cmd(
    ctx: typer.Context,
    task: Annotated[str, typer.Option(help="Task whose failed or killed files to resubmit.")],
    job: Annotated[str | None, typer.Option(help="Only this job of the task.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Put a task's failed and killed files back in the queue, with a fresh attempt budget."""
    _user_action(ctx, "resubmit", task, job, json_out)


@app.command("publish", rich_help_panel=USERS)
def publish_cmd(
    ctx: typer.Context,
    retry: Annotated[
        str,
        typer.Option("--retry", help="Task whose failed publications to retry.", metavar="TASK"),
    ],
    job: Annotated[str | None, typer.Option(help="Only this job of the task.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Give a task's files whose publication failed back to the publisher."""
    _user_action(ctx, "publish --retry", retry, job, json_out)


# --- agents ----------------------------------------------------------------------------------
@app.command("agent", rich_help_panel=SERVICES)
def agent_cmd(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Agent: " + ", ".join(AGENTS) + ".")],
    instance: Annotated[
        str | None,
        typer.Option(help="Instance name (default: HOST-PID); unique among the agent's instances."),
    ] = None,
    once: Annotated[bool, typer.Option("--once", help="Run one cycle and stop.")] = False,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=65535,
            help="Serve metrics from this port upward (default: metrics.port; 0: none).",
        ),
    ] = None,
) -> None:
    """Run one agent instance in the foreground until Ctrl-C or SIGTERM."""
    if name not in AGENTS:
        raise UsageError(f"unknown agent {name!r}; one of {', '.join(AGENTS)}")
    config = _config(ctx)
    if metrics_port is not None:
        config.metrics.port = metrics_port
    agent = agent_class(name)(config, instance)
    _log_instance(agent.instance)
    runner = Runner(agent)
    runner.install_signal_handlers()
    runner.run(once=once)


@app.command("run", rich_help_panel=OPERATORS)
def run_cmd(
    ctx: typer.Context,
    agents_only: Annotated[
        bool, typer.Option("--agents-only", help="Only the agents (the store runs elsewhere).")
    ] = False,
    host_id: Annotated[
        str | None,
        typer.Option(help="Name of this agent host in instance names (default: the host name)."),
    ] = None,
) -> None:
    """Run the whole service here: store, storage and every agent, supervised; Ctrl-C stops."""
    config = _config(ctx)
    Supervisor(config, config.source, agents_only=agents_only, host_id=host_id).run()


def _log_instance(instance: str) -> None:
    """Every log line of an agent process names its instance."""
    old = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = old(*args, **kwargs)
        record.msg = f"[{instance}] {record.msg}"
        return record

    logging.setLogRecordFactory(factory)


GLOBAL_FLAGS = ("--verbose", "-v")
GLOBAL_VALUED = ("--config", "-c")


def global_options_first(args: list[str]) -> list[str]:
    """`aso status T --config F` read as `aso --config F status T`: people type the options of
    `aso` itself wherever they think of them, and no sub-command has options of these names."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest += args[i:]
            break
        if arg in GLOBAL_VALUED and i + 1 < len(args):
            front += args[i : i + 2]
            i += 2
            continue
        (front if arg in GLOBAL_FLAGS or arg.startswith("--config=") else rest).append(arg)
        i += 1
    return front + rest


def main() -> None:
    """Console entry point: run the app, turn known failures into one-line errors."""
    try:
        # Not standalone: click's own usage errors come here, to end in one line like ours.
        code = app(args=global_options_first(sys.argv[1:]), prog_name="aso", standalone_mode=False)
    except ClickException as exc:
        context = getattr(exc, "ctx", None)
        where = f" (`{context.command_path} --help` shows the usage)" if context else ""
        err_console.print(f"aso: error: {exc.format_message()}{where}", markup=False,
                          highlight=False)  # fmt: skip
        sys.exit(exc.exit_code)
    except typer.Abort:
        err_console.print("aso: interrupted", markup=False)
        sys.exit(130)
    except (ConfigError, UsageError, CredentialError) as exc:
        err_console.print(f"aso: error: {exc}", markup=False, highlight=False)
        sys.exit(2)
    except StoreError as exc:
        hint = f"; {NO_CONFIG_HINT}" if BUILT_IN_DEFAULTS else ""
        if not exc.retryable:
            err_console.print(f"aso: error: {exc}{hint}", markup=False, highlight=False)
            sys.exit(1)
        # A job wrapper retries on this code; every write ASO makes is idempotent (an upload
        # again reports what the failed call did record as "already recorded").
        err_console.print(
            f"aso: error: {exc} (retryable: try again later){hint}", markup=False, highlight=False
        )
        sys.exit(EXIT_RETRYABLE)
    except (LocalStoreError, StorageError, model.ModelError, ValueError, NotFound) as exc:
        err_console.print(f"aso: error: {exc}", markup=False, highlight=False)
        sys.exit(1)
    except KeyboardInterrupt:
        err_console.print("aso: interrupted", markup=False)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
