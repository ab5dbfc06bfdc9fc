"""Design documents from the `couchapp/` folder, and `aso db init`.

Each sub-folder of `couchapp/` holding an `_id` file is one design document in the classic
CouchApp layout (`views/NAME/map.js` + `reduce.js`, `validate_doc_update.js`, `_attachments/`),
assembled by `cmscouchapp` (CMS's Python 3 CouchApp). ASO adds one generated member,
`lib/model`: the tables of aso/model.py that validate_doc_update `require`s, so the Python model
and the store's validation cannot drift apart; and `lib/sites`, the site catalogue's names, so
that the store refuses a request naming a site no agent could copy from or to. Pushing goes
through aso.store and is idempotent: an unchanged design document is not rewritten.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from couchapp import localdoc

from aso import model
from aso.catalog import embedded as catalog
from aso.config import Config
from aso.monitoring import statistics, summaries
from aso.store import Forbidden, NotFound, Server
from aso.store import admin as store_admin
from aso.transfer.jobstore import SECURITY as JOBS_SECURITY

log = logging.getLogger("aso.db")

COUCHAPP_DIR = Path(__file__).resolve().parents[2] / "couchapp"
# couchapp/pages is the monitoring pages' design document, in a database of its own
# (store.pages_db); every other folder is a design document of the files database.
PAGES_FOLDER = "pages"
PAGES_DDOC = "_design/pages"
PAGES_INDEX = "index.html"

# The pages' database: anyone may read it (the login page loads before a session exists); its
# validate_doc_update refuses every write but the store admin's. It holds no data: the pages
# read the files and statistics databases with the reader's own session or certificate.
PAGES_SECURITY: dict[str, dict[str, list[str]]] = {
    "admins": {"names": [], "roles": []},
    "members": {"names": [], "roles": []},
}

# Who may use the files database: any ASO role reads (a member); writes are then decided by
# validate_doc_update. No database admins: design documents (code the store runs) and
# `_security` are the store admin's alone (`aso db init`), on both stores.
FILES_SECURITY = {
    "admins": {"names": [], "roles": []},
    "members": {"names": [], "roles": [model.USER_ROLE, model.AGENT_ROLE, *model.ADMIN_ROLES[1:]]},
}

# The store's accounts: written by its admin alone (`aso db init`, the front end's own accounts).
# A store answers an anonymous sign-up in `_users` otherwise (the embedded store on its port),
# and an account made that way under a user's name locked the user out of the front end.
USERS_SECURITY = {
    "admins": {"names": [], "roles": []},
    "members": {"names": [], "roles": ["_admin"]},
}

# The store's other system databases, where it has them (pouchdb-server makes `_replicator` at
# start, a CouchDB cluster's setup `_replicator` and maybe `_global_changes`): kept to the admin
# as `_users` is. None is ASO's and none is created here; `_replicator` makes the store connect
# wherever a document written there says (EMBEDDED_OPEN_SYSTEM_DATABASES).
SYSTEM_DATABASES = ("_replicator", "_global_changes")
SYSTEM_SECURITY = USERS_SECURITY


def model_module(tables: Mapping[str, Any] | None = None) -> str:
    """The CommonJS module validate_doc_update loads with require('lib/model'): the files
    database's tables, or `tables`."""
    tables = model.validation_model() if tables is None else tables
    return "module.exports = " + json.dumps(tables, sort_keys=True) + ";\n"


def known_sites(config: Config) -> list[str]:
    """The sites a request may name: the site catalogue's (`[sites.NAME]`; the simulator's are
    simulated sites, protocol sim)."""
    return sorted(config.sites)


def sites_module(config: Config) -> str:
    """The CommonJS module validate_doc_update loads with require('lib/sites'). A site added to
    the catalogue reaches the store with `aso db init`; until then uploads naming it are
    refused (and `aso store check` reports the design document as out of date)."""
    return "module.exports = " + json.dumps({"names": known_sites(config)}) + ";\n"


# Where the store's JavaScript takes a table of ASO's Python (CouchDB's views cannot `require` a
# module of the design document outside views/lib, nor can the embedded store's): the marker is
# replaced by the table as JSON when the design document is assembled.
TABLES: dict[str, Any] = {
    "/* aso/model.py WORK */ null": model.WORK,
    "/* aso/model.py PUBLICATION_FAILURES */ null": model.PUBLICATION_FAILURES,
    "/* aso/model.py FAILING */ null": model.FAILING,
    "/* aso/model.py FINAL */ null": {axis: list(v) for axis, v in model.FINAL.items()},
    "/* aso/model.py NEVER_COPIED */ null": list(model.NEVER_COPIED),
    "/* aso/model.py REQUEST_TYPE */ null": model.REQUEST_TYPE,
    "/* aso/model.py WAITING_WHY */ null": model.WAITING_WHY,
    "/* aso/model.py AT_THE_SERVICE */ null": list(model.AT_THE_SERVICE),
    "/* aso/model.py HELD */ null": model.HELD,
    "/* aso/monitoring/statistics.py ENDED_STATES */ null": list(statistics.ENDED_STATES),
    "/* aso/monitoring/statistics.py COLUMNS */ null": list(statistics.COLUMNS),
    "/* aso/monitoring/statistics.py BUCKETS */ null": list(statistics.BUCKETS),
    "/* aso/monitoring/statistics.py BUCKET_NAMES */ null": list(statistics.BUCKET_NAMES),
    "/* aso/monitoring/statistics.py UNKNOWN_CLASS */ null": statistics.UNKNOWN_CLASS,
    "/* aso/monitoring/statistics.py BATCH */ null": statistics.BATCH,
    "/* aso/monitoring/statistics.py COMPLETE */ null": statistics.COMPLETE,
    "/* aso/monitoring/statistics.py PENDING */ null": statistics.PENDING,
    "/* aso/monitoring/summaries.py TYPES */ null": list(summaries.TYPES),
}
# A function several design documents share, kept once under couchapp/shared/: the line
# `// aso include: shared/<file>.js` is replaced by the file.
INCLUDE = re.compile(r"^[ \t]*// aso include: (shared/[\w/.-]+\.js)[ \t]*$", re.M)


def with_tables(source: str, root: Path = COUCHAPP_DIR) -> str:
    """`source` with its markers replaced: the tables of ASO's Python and the shared files."""
    source = INCLUDE.sub(lambda m: (root / m.group(1)).read_text().rstrip("\n"), source)
    for marker, table in TABLES.items():
        source = source.replace(marker, json.dumps(table))
    return source


def load_design_document(
    path: Path, config: Config | None = None, root: Path = COUCHAPP_DIR
) -> dict[str, Any]:
    doc: dict[str, Any] = localdoc.document(str(path), is_ddoc=True).doc()
    # cmscouchapp's bookkeeping (manifest, signatures) lists files in directory order; it is
    # not used by the store and would make identical folders look different.
    doc.pop("couchapp", None)
    if path.name == NOTIFY_FOLDER:
        # The notify database's validation: its own tables, the files database's schema checker.
        schema_js = (root / "asyncstageout" / "lib" / "schema.js").read_text()
        doc["lib"] = {"model": model_module(model.notify_model()), "schema": schema_js}
    elif "require('lib/" in doc.get("validate_doc_update", ""):
        doc.setdefault("lib", {}).update(
            model=model_module(), sites=sites_module(config or Config())
        )
    if "validate_doc_update" in doc:
        doc["validate_doc_update"] = with_tables(doc["validate_doc_update"], root)
    for view in doc.get("views", {}).values():
        view["map"] = with_tables(view["map"], root)
    return doc


# The folders of couchapp/ that are design documents of another database than the files one
# (the [store] key naming it); couchapp/pages is the pages' own, couchapp/shared no document.
OTHER_DATABASES = {
    "catalog": "catalog_db",
    "jobs": "transfers_db",
    "stats": "stats_db",
    "notify": "notify_db",
}
NOTIFY_FOLDER = "notify"
# The notify database: users' subscriptions, through the front end's own-subscription routes
# only (a user is a member so that the store judges their write as theirs).
NOTIFY_SECURITY = FILES_SECURITY


def design_documents(config: Config, root: Path = COUCHAPP_DIR) -> list[dict[str, Any]]:
    """The files database's design documents of `root` for `config` (the validation knows its
    sites)."""
    folders = sorted(
        p
        for p in root.iterdir()
        if (p / "_id").is_file() and p.name != PAGES_FOLDER and p.name not in OTHER_DATABASES
    )
    return [load_design_document(folder, config, root) for folder in folders]


def database_design(folder: str, root: Path = COUCHAPP_DIR) -> dict[str, Any]:
    """The design document of another database (OTHER_DATABASES): the catalog's, the job
    table's, the statistics'."""
    return load_design_document(root / folder, None, root)


def pages_design(config: Config, root: Path = COUCHAPP_DIR) -> dict[str, Any]:
    """The monitoring pages' design document, with what the pages need to know of `config`
    (where the requests and the summaries are, the FTS web monitor's links, the groups of
    states they show)."""
    ddoc = load_design_document(root / PAGES_FOLDER, config)
    ddoc["aso"] = {
        "files_db": config.store.files_db,
        "stats_db": config.store.stats_db,
        "transfer_job_url": config.fts3.monitor_url,
        "states": {k: list(v) for k, v in model.PAGES_STATES.items()},
        "waiting_words": model.WAITING_WORDS,
        # What users' subscriptions may name (`aso notify add` checks before it writes): the
        # allowlists, not the mail server's URL (a secret).
        "notify": {
            "mail": bool(config.notify.user_mail),
            "mail_domains": list(config.notify.mail_domains),
            "webhooks": list(config.notify.webhooks),
        },
    }
    return ddoc


def pages_url(config: Config, base: str | None = None) -> str:
    """The monitoring pages' address under `base` (default: the store's URL; the front end's
    serves the same path)."""
    root = (base or config.store.url).rstrip("/")
    return f"{root}/{config.store.pages_db}/{PAGES_DDOC}/{PAGES_INDEX}"


@dataclass
class InitReport:
    created_dbs: list[str] = field(default_factory=list)
    design_written: list[str] = field(default_factory=list)
    design_unchanged: list[str] = field(default_factory=list)
    users_changed: list[str] = field(default_factory=list)
    closed_dbs: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"created database {name}" for name in self.created_dbs]
        out += [f"system database {name} kept to the admin" for name in self.closed_dbs]
        out += [f"design document {d} written" for d in self.design_written]
        out += [f"design document {d} unchanged" for d in self.design_unchanged]
        out += [f"account {u} created/updated" for u in self.users_changed]
        return out


KINDS = ("names", "roles")  # what each part of a `_security` lists


def same_security(one: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    """Whether two `_security` objects let in the same names and roles."""

    def normal(security: Mapping[str, Any]) -> dict[str, dict[str, list[str]]]:
        return {
            part: {kind: sorted((security.get(part) or {}).get(kind) or []) for kind in KINDS}
            for part in ("admins", "members")
        }

    return normal(one) == normal(other)


def close_system_databases(admin: Server) -> list[str]:
    """Keep each system database of SYSTEM_DATABASES that the store has to the admin; the
    names of those whose `_security` this changed."""
    changed = []
    for name in SYSTEM_DATABASES:
        db = admin.db(name)
        try:
            current = store_admin.security(db)
        except NotFound:
            continue  # this store has none: nothing to close
        if not same_security(current, SYSTEM_SECURITY):
            store_admin.set_security(db, SYSTEM_SECURITY)
            changed.append(name)
    return changed


def init_catalog_db(admin: Server, name: str = catalog.DEFAULT_DB) -> bool:
    """Create the catalog database (True if created now), set its `_security` and push its
    design document. Idempotent."""
    created = store_admin.create_db(admin, name, catalog.SECURITY)
    store_admin.push_design(admin.db(name), database_design("catalog"))
    return created


def init_stats_db(admin: Server, name: str) -> bool:
    """Create the statistics database (True if created now) with its `_security` and design
    document (the live statistics' design document comes with the files database's).
    Idempotent."""
    created = store_admin.create_db(admin, name, statistics.SECURITY)
    store_admin.push_design(admin.db(name), database_design("stats"))
    return created


def init_databases(admin: Server, config: Config) -> InitReport:
    """Create the databases, push the design documents, set `_security` (the store's system
    databases kept to the admin), create the agent account. Safe to run again: what is
    already in place is left as it is."""
    report = InitReport()
    files_db = config.store.files_db
    if store_admin.create_db(admin, files_db, FILES_SECURITY, q=config.store.files_q):
        report.created_dbs.append(files_db)
    db = admin.db(files_db)
    for ddoc in design_documents(config):
        written = store_admin.push_design(db, ddoc)
        (report.design_written if written else report.design_unchanged).append(ddoc["_id"])
    if store_admin.create_db(admin, config.store.transfers_db, JOBS_SECURITY):
        report.created_dbs.append(config.store.transfers_db)
    jobs = database_design("jobs")
    if store_admin.push_design(admin.db(config.store.transfers_db), jobs):
        report.design_written.append(f"{config.store.transfers_db}/{jobs['_id']}")
    if init_catalog_db(admin, config.store.catalog_db):
        report.created_dbs.append(config.store.catalog_db)
    if init_stats_db(admin, config.store.stats_db):
        report.created_dbs.append(config.store.stats_db)
    if store_admin.create_db(admin, config.store.notify_db, NOTIFY_SECURITY):
        report.created_dbs.append(config.store.notify_db)
    notify = database_design(NOTIFY_FOLDER)
    if store_admin.push_design(admin.db(config.store.notify_db), notify):
        report.design_written.append(f"{config.store.notify_db}/{notify['_id']}")
    pages_db = config.store.pages_db
    if store_admin.create_db(admin, pages_db, PAGES_SECURITY):
        report.created_dbs.append(pages_db)
    if store_admin.push_design(admin.db(pages_db), pages_design(config)):
        report.design_written.append(f"{pages_db}/{PAGES_DDOC}")
    else:
        report.design_unchanged.append(f"{pages_db}/{PAGES_DDOC}")
    try:
        if store_admin.create_db(admin, "_users", USERS_SECURITY):
            report.created_dbs.append("_users")
    except Forbidden as exc:  # CouchDB without users_db_security_editable
        raise Forbidden(
            403,
            "forbidden",
            f"_users cannot be kept to the admin ({exc.reason}): set [couchdb] "
            "users_db_security_editable = true (deploy/couchdb/local.ini), then run `aso db init`",
        ) from None
    report.closed_dbs += close_system_databases(admin)
    if config.store.agent_user:
        if not config.store.agent_password:
            raise ValueError("store.agent_password is empty; run `aso config init`")
        if store_admin.put_user(
            admin, config.store.agent_user, config.store.agent_password, [model.AGENT_ROLE]
        ):
            report.users_changed.append(config.store.agent_user)
    for line in report.lines():
        log.debug("db init: %s", line)
    return report
