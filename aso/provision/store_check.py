"""`aso store check`: is this CouchDB-API store fit for ASO, and if not, what is wrong?

Two halves. `gather` asks the store (through aso.store only) and keeps its answers as they came,
in an `Answers`; `analyse` turns answers and what the configuration expects (`Expected`) into
findings, each ok, warn or error. The analysis is plain functions over dicts, so the branches
only a real CouchDB 3 reaches (cluster membership, q/n, proxy authentication) are tested with
answers shaped like CouchDB's documented ones (tests/test_storecheck.py).

What is checked: the server (vendor, version, CouchDB or the embedded store), the credentials
(a server admin is needed to read the configuration), per node the settings that matter to ASO
(authentication handlers and proxy authentication with a secret for `frontend.auth = proxy`,
`require_valid_user` (false: anonymous requests meet `_security`), `max_document_size` and
`max_http_request_size` against what ASO writes, the JavaScript query server's
`os_process_timeout`, the attachments' Content-Security-Policy that the monitoring pages need,
the bind address), the cluster (every member
connected, q/n defaults and each ASO database's q/n), each ASO database (exists, `_security`
closed and holding ASO's roles, design documents up to date), each system database the store has
(`_users`, `_replicator`, `_global_changes`: kept to the server admins, or an error whose fix is
`aso db init`) and the agent account. Against the embedded store its known differences
(docs/store-quirks.md's EMBEDDED_* that an operator must know) are warnings.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

from aso import model
from aso.catalog import embedded as catalog
from aso.config import Config
from aso.monitoring import statistics
from aso.provision.designdocs import (
    FILES_SECURITY,
    NOTIFY_FOLDER,
    NOTIFY_SECURITY,
    PAGES_SECURITY,
    SYSTEM_DATABASES,
    USERS_SECURITY,
    database_design,
    design_documents,
    pages_design,
)
from aso.store import (
    COUCHDB,
    EMBEDDED,
    NotFound,
    Server,
    StoreError,
    kind_of,
)
from aso.store import admin as store_admin
from aso.transfer import jobstore

OK, WARN, ERROR = "ok", "warn", "error"
# The attachments' Content-Security-Policy. CouchDB's default, `sandbox`, stops every script of
# a design document's attachments: the monitoring pages stay blank. This policy lets the pages'
# own files run (app.js, style.css: no inline script or style, nothing from another origin) and
# nothing else; users cannot write attachments (validate_doc_update refuses `_attachments`).
ATTACHMENTS_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
    "form-action 'self'"
)

LEVELS = (OK, WARN, ERROR)
NOT_ADMIN = "not a server admin"  # Answers.config_error when the credentials are not an admin's

# Sizes of what ASO writes, measured on this code (docs/design.md, "The document store"):
# a request is at most model.MAX_DOC_CHARS of JSON (validate_doc_update refuses larger) and
# ~1.7 KB when finished; a purge batch in the statistics database holds ~330 bytes of JSON per
# request (analytics.batch of them); a catalog block ~2 KB per file with a few hundred lumis,
# at most publish_info's bound and the file's LFN and figures (and publisher.max_block_bytes in
# all).
PURGE_ENTRY_BYTES = 400
BLOCK_FILE_BYTES = model.MAX_PUBLISH_INFO_CHARS + 2048
# CouchDB measures max_document_size on the Erlang form of the document, larger than its JSON.
ERLANG_OVERHEAD = 2
DEFAULT_OS_PROCESS_TIMEOUT_MS = 5000  # CouchDB 3's default ([couchdb] os_process_timeout)
PROXY_HANDLER = "{chttpd_auth, proxy_authentication_handler}"
# CouchDB 3's default handlers when [chttpd] authentication_handlers is not set (default.ini).
DEFAULT_HANDLERS = (
    "{chttpd_auth, cookie_authentication_handler}, {chttpd_auth, default_authentication_handler}"
)
# The header names aso/frontend/server.py sends: CouchDB's defaults ([chttpd_auth] x_auth_*).
PROXY_HEADERS = {
    "x_auth_username": "X-Auth-CouchDB-UserName",
    "x_auth_roles": "X-Auth-CouchDB-Roles",
    "x_auth_token": "X-Auth-CouchDB-Token",
}
# Python's hashlib names (frontend.proxy_hash) as CouchDB's [chttpd_auth] hash_algorithms spell
# them (Erlang crypto names).
ERLANG_HASH = {"sha1": "sha", "sha224": "sha224", "sha256": "sha256", "sha384": "sha384",
               "sha512": "sha512"}  # fmt: skip

# The embedded store's differences an operator must know (docs/store-quirks.md names each).
EMBEDDED_WARNINGS = (
    ("EMBEDDED_IGNORES_PROXY_AUTH", "proxy-authentication headers are ignored: the front end "
     "must use frontend.auth = \"session\" (per-user accounts)"),
    ("EMBEDDED_FEED_NEVER_TIMES_OUT", "a _changes long poll never times out there: ASO's clients "
     "end it with their own read timeout; other clients may hang"),
    ("EMBEDDED_SINGLE_PROCESS", "one Node.js process for every request and view build "
     "(~5,100 docs/s bulk inserts, ~780 docs/s per view build): one machine's load"),
    ("EMBEDDED_REQUEST_GUARD", "requests that killed the whole server, ran code in it or made a "
     "member an admin are refused by its request guard (deploy/store/request-guard.js); keep it "
     "on loopback, reached by ASO and its front end only"),
    ("EMBEDDED_OPEN_SECURITY", "a new database is open to anonymous writers until its _security "
     "is set (`aso db init` sets ASO's); there is no require_valid_user"),
    ("EMBEDDED_SINGLE_NODE", "no cluster: one copy of every document (q/n do not apply); back up "
     "embedded.data_dir"),
)  # fmt: skip


@dataclass(frozen=True)
class Finding:
    level: str  # OK, WARN or ERROR
    item: str  # what was looked at: "auth handlers", "database asynctransfer _security", ...
    detail: str


# --- what the configuration expects -----------------------------------------------------------
@dataclass(frozen=True)
class DatabaseSpec:
    security: Mapping[str, Any]
    design: tuple[Mapping[str, Any], ...]


@dataclass
class Expected:
    frontend_auth: str = "session"
    frontend_secret: str = ""
    proxy_hash: str = "sha256"
    max_body: int = 67108864
    min_document_size: int = 1_000_000
    databases: dict[str, DatabaseSpec] = field(default_factory=dict)
    agent_user: str = ""


def largest_document(config: Config) -> int:
    """The largest document ASO may write, in bytes of JSON (see PURGE_ENTRY_BYTES)."""
    return max(
        model.MAX_DOC_CHARS,
        config.analytics.batch * PURGE_ENTRY_BYTES,
        min(
            config.publisher.max_files_per_block * BLOCK_FILE_BYTES,
            config.publisher.max_block_bytes,
        ),
    )


def expected_databases(config: Config) -> dict[str, DatabaseSpec]:
    """Each ASO database with the `_security` and design documents `aso db init` gives it
    (aso/provision/designdocs.py init_databases; tests/test_storecheck.py holds the two
    together)."""
    store = config.store
    return {
        store.files_db: DatabaseSpec(FILES_SECURITY, tuple(design_documents(config))),
        store.transfers_db: DatabaseSpec(jobstore.SECURITY, (database_design("jobs"),)),
        store.catalog_db: DatabaseSpec(catalog.SECURITY, (database_design("catalog"),)),
        store.stats_db: DatabaseSpec(statistics.SECURITY, (database_design("stats"),)),
        store.notify_db: DatabaseSpec(NOTIFY_SECURITY, (database_design(NOTIFY_FOLDER),)),
        store.pages_db: DatabaseSpec(PAGES_SECURITY, (pages_design(config),)),
        "_users": DatabaseSpec(USERS_SECURITY, ()),
    }


def expected_of(config: Config) -> Expected:
    return Expected(
        frontend_auth=config.frontend.auth,
        frontend_secret=config.frontend.secret,
        proxy_hash=config.frontend.proxy_hash,
        max_body=config.frontend.max_body,
        min_document_size=ERLANG_OVERHEAD * largest_document(config),
        databases=expected_databases(config),
        agent_user=config.store.agent_user,
    )


# --- what the store answered --------------------------------------------------------------------
@dataclass
class DatabaseAnswers:
    info: dict[str, Any] | None  # GET /db; None: no such database
    security: dict[str, Any] = field(default_factory=dict)  # GET /db/_security
    design: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # id → stored


@dataclass
class Answers:
    url: str  # without credentials
    welcome: dict[str, Any]  # GET /
    session: dict[str, Any]  # the userCtx of GET /_session
    membership: dict[str, Any] | None = None  # GET /_membership
    configs: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)  # node → config
    config_error: str = ""  # why the configuration could not be read
    databases: dict[str, DatabaseAnswers] = field(default_factory=dict)
    # GET /{name}/_security of each of the store's other system databases (None: it has none)
    system_databases: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    agent_account: dict[str, Any] | None = None  # its _users document
    agent_password_works: bool | None = None  # None: not tried (no password in the config)

    @property
    def kind(self) -> str:
        return kind_of(self.welcome)


def gather(server: Server, expected: Expected, agent_password: str = "") -> Answers:
    """Ask the store everything `analyse` looks at. Raises StoreError when the store cannot be
    reached or refuses the credentials (the first two requests): nothing else can be checked."""
    answers = Answers(url=server.url, welcome=server.info(), session=server.session())
    if "_admin" not in (answers.session.get("roles") or []):
        answers.config_error = NOT_ADMIN
        return answers
    answers.membership = _optional(store_admin.membership, server)
    answers.configs, answers.config_error = _node_configs(server, answers)
    for name, spec in expected.databases.items():
        answers.databases[name] = _database_answers(server, name, spec)
    for name in SYSTEM_DATABASES:
        answers.system_databases[name] = _optional(store_admin.security, server.db(name))
    if expected.agent_user:
        answers.agent_account = server.db("_users").get(f"org.couchdb.user:{expected.agent_user}")
        if agent_password and answers.agent_account is not None:
            probe = Server(server.url, expected.agent_user, agent_password, server.settings)
            answers.agent_password_works = probe.session().get("name") == expected.agent_user
    return answers


def _optional(ask: Any, *args: Any) -> Any:
    try:
        return ask(*args)
    except StoreError:
        return None


def _node_configs(server: Server, answers: Answers) -> tuple[dict[str, Any], str]:
    """The configuration of every connected member node (each node has its own: proxy auth
    must be on for every node the front end may reach), or of the one embedded store."""
    if answers.kind == EMBEDDED:
        nodes = ["_local"]
    else:
        nodes = sorted(set(_members(answers.membership)) & set(_connected(answers.membership)))
        nodes = nodes or ["_local"]
    configs = {}
    try:
        for node in nodes:
            configs[node] = store_admin.node_config(server, node)
    except StoreError as exc:
        return configs, str(exc)
    return configs, ""


def _database_answers(server: Server, name: str, spec: DatabaseSpec) -> DatabaseAnswers:
    db = server.db(name)
    try:
        info = db.info()
    except NotFound:
        return DatabaseAnswers(info=None)
    design = {ddoc["_id"]: db.get(ddoc["_id"]) for ddoc in spec.design}
    return DatabaseAnswers(info=info, security=store_admin.security(db), design=design)


# --- the analysis ---------------------------------------------------------------------------------
def analyse(answers: Answers, expected: Expected) -> list[Finding]:
    findings = check_server(answers.welcome, answers.url)
    findings += check_credentials(answers.session, answers.config_error)
    if answers.kind == EMBEDDED:
        findings += check_embedded(answers, expected)
    else:
        findings += check_membership(answers.membership)
        nodes = len(_members(answers.membership)) or 1
        for node, config in answers.configs.items():
            prefix = f"{node}: " if len(answers.configs) > 1 else ""
            findings += [
                Finding(f.level, prefix + f.item, f.detail)
                for f in check_node_config(config, expected, answers.welcome, nodes)
            ]
    findings += check_databases(answers, expected)
    if answers.config_error != NOT_ADMIN:
        findings += check_agent(answers, expected)
    return findings


def check_server(welcome: Mapping[str, Any], url: str) -> list[Finding]:
    kind = kind_of(welcome)
    version = str(welcome.get("version", "?"))
    vendor = (welcome.get("vendor") or {}).get("name", "?")
    what = f"{vendor} {version} ({'CouchDB' if kind == COUCHDB else 'embedded store'}) at {url}"
    if kind == EMBEDDED:
        return [Finding(OK, "server", what)]
    major = _major(version)
    if major is None or major < 3:
        return [Finding(ERROR, "server", f"{what}: ASO needs Apache CouchDB 3")]
    if major > 3:
        return [Finding(WARN, "server", f"{what}: ASO is made and tested for CouchDB 3")]
    return [Finding(OK, "server", what)]


def _major(version: str) -> int | None:
    match = re.match(r"(\d+)\.", version)
    return int(match.group(1)) if match else None


def _version(welcome: Mapping[str, Any]) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", str(welcome.get("version", "")))[:3])


def check_credentials(session: Mapping[str, Any], config_error: str) -> list[Finding]:
    name = session.get("name") or "anonymous"
    roles = ", ".join(session.get("roles") or []) or "no roles"
    if config_error == NOT_ADMIN:
        return [
            Finding(
                ERROR,
                "credentials",
                f"{name} ({roles}) is not a server admin: the configuration, the databases' "
                "_security and the accounts cannot be checked (use the admin account)",
            )
        ]
    findings = [Finding(OK, "credentials", f"{name} ({roles})")]
    if config_error:
        findings.append(
            Finding(ERROR, "configuration", f"cannot read the configuration: {config_error}")
        )
    return findings


def check_embedded(answers: Answers, expected: Expected) -> list[Finding]:
    """The embedded store: what it cannot do, said as warnings; proxy auth asked of it is an
    error (the front end would forward anonymous requests)."""
    findings = [
        Finding(WARN, "embedded store", f"{name}: {text}") for name, text in EMBEDDED_WARNINGS
    ]
    if expected.frontend_auth == "proxy":
        findings.append(
            Finding(
                ERROR,
                "proxy authentication",
                'frontend.auth = "proxy" but the embedded store ignores proxy headers '
                '(EMBEDDED_IGNORES_PROXY_AUTH): use "session"',
            )
        )
    host = urlsplit(answers.url).hostname or ""
    findings.append(_bind_finding(host, "store.url host"))
    config = next(iter(answers.configs.values()), {})
    size = _int(_get(config, "couchdb", "max_document_size"))
    if size is not None:
        findings.append(_document_size_finding(size, expected.min_document_size))
    return findings


def check_membership(membership: Mapping[str, Any] | None) -> list[Finding]:
    """`GET /_membership`: `cluster_nodes` are the configured members (mem3:nodes()),
    `all_nodes` this node and the nodes connected to it (src/mem3/src/mem3_httpd.erl). A member
    that is not connected is down or cut off."""
    if membership is None:
        return [Finding(ERROR, "cluster", "GET /_membership failed")]
    members, connected = set(_members(membership)), set(_connected(membership))
    findings = []
    for node in sorted(members - connected):
        findings.append(
            Finding(ERROR, "cluster", f"member {node} is not connected (down or cut off)")
        )
    for node in sorted(connected - members):
        findings.append(
            Finding(WARN, "cluster", f"{node} is connected but not a member of the cluster")
        )
    if not members:
        findings.append(
            Finding(
                WARN,
                "cluster",
                "no member nodes listed: the node is not set up (single_node = true, or "
                "`aso store setup-cluster`)",
            )
        )
    if not findings:
        shape = "single node" if len(members) == 1 else f"{len(members)} nodes, all connected"
        findings.append(Finding(OK, "cluster", f"{shape}: {', '.join(sorted(members))}"))
    return findings


def _members(membership: Mapping[str, Any] | None) -> list[str]:
    return list((membership or {}).get("cluster_nodes") or [])


def _connected(membership: Mapping[str, Any] | None) -> list[str]:
    return list((membership or {}).get("all_nodes") or [])


def check_node_config(
    config: Mapping[str, Mapping[str, str]],
    expected: Expected,
    welcome: Mapping[str, Any],
    nodes: int,
) -> list[Finding]:
    """One CouchDB node's configuration (`GET /_node/{node}/_config`), all values strings."""
    findings = check_authentication(config, expected, welcome)
    findings.append(check_require_valid_user(config))
    findings.append(check_users_db_security(config))
    size = _int(_get(config, "couchdb", "max_document_size"))
    if size is not None:
        findings.append(_document_size_finding(size, expected.min_document_size))
    findings.append(check_request_size(config, expected))
    findings.append(check_os_process_timeout(config))
    findings.append(check_js_engine(config, welcome))
    findings.append(check_attachments_csp(config))
    findings.append(_bind_finding(_get(config, "chttpd", "bind_address") or "127.0.0.1", "bind"))
    findings += check_cluster_defaults(config, nodes)
    return findings


def _get(config: Mapping[str, Mapping[str, str]], section: str, key: str) -> str | None:
    value = (config.get(section) or {}).get(key)
    return None if value is None else _strip_comment(str(value))


def _strip_comment(value: str) -> str:
    """A value as read from an ini file may keep its ` ; comment` (CouchDB cuts a value at a
    semicolon after white space only: a Content-Security-Policy holds bare ones)."""
    return re.split(r"[ \t];", value, maxsplit=1)[0].strip()


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _handlers(config: Mapping[str, Mapping[str, str]]) -> list[str]:
    text = _get(config, "chttpd", "authentication_handlers") or DEFAULT_HANDLERS
    return [re.sub(r"\s+", " ", h.strip()) for h in re.findall(r"\{[^}]*\}", text)]


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def check_authentication(
    config: Mapping[str, Mapping[str, str]], expected: Expected, welcome: Mapping[str, Any]
) -> list[Finding]:
    handlers = _handlers(config)
    proxy_on = PROXY_HANDLER in handlers
    with_secret = _true(_get(config, "chttpd_auth", "proxy_use_secret"))
    secret = _get(config, "chttpd_auth", "secret") or ""
    findings = [
        Finding(OK, "auth handlers", ", ".join(h.split(",")[1].strip(" }") for h in handlers))
    ]
    if proxy_on and not (with_secret and secret):
        findings.append(
            Finding(
                ERROR,
                "proxy authentication",
                "proxy_authentication_handler is on without [chttpd_auth] proxy_use_secret = "
                "true and a secret: anyone who reaches the store can claim any user and role",
            )
        )
        return findings
    if expected.frontend_auth != "proxy":
        detail = "on, with a secret" if proxy_on else "off"
        findings.append(
            Finding(OK, "proxy authentication", f'{detail} (frontend.auth = "session")')
        )
        return findings
    if not proxy_on:
        findings.append(
            Finding(
                ERROR,
                "proxy authentication",
                'frontend.auth = "proxy" needs {chttpd_auth, proxy_authentication_handler} in '
                "[chttpd] authentication_handlers (deploy/couchdb/local.ini)",
            )
        )
        return findings
    findings += _proxy_details(config, expected, welcome, secret)
    return findings


def _proxy_details(
    config: Mapping[str, Mapping[str, str]],
    expected: Expected,
    welcome: Mapping[str, Any],
    secret: str,
) -> list[Finding]:
    """Proxy authentication is on with a secret: does it accept what the front end sends?"""
    problems = []
    if expected.frontend_secret and expected.frontend_secret != secret:
        problems.append("[chttpd_auth] secret is not frontend.secret")
    if not expected.frontend_secret:
        problems.append("frontend.secret is empty")
    for key, header in PROXY_HEADERS.items():
        value = _get(config, "chttpd_auth", key)
        if value and value.lower() != header.lower():
            problems.append(f"[chttpd_auth] {key} = {value}: the front end sends {header}")
    wanted = ERLANG_HASH.get(expected.proxy_hash, expected.proxy_hash)
    algorithms = _hash_algorithms(config, welcome)
    if wanted not in algorithms:
        problems.append(
            f"frontend.proxy_hash {expected.proxy_hash} is not in [chttpd_auth] hash_algorithms "
            f"({', '.join(algorithms)})"
        )
    if problems:
        return [Finding(ERROR, "proxy authentication", "; ".join(problems))]
    return [Finding(OK, "proxy authentication", "on, with the front end's secret and hash")]


def _hash_algorithms(
    config: Mapping[str, Mapping[str, str]], welcome: Mapping[str, Any]
) -> list[str]:
    """[chttpd_auth] hash_algorithms, or the default: sha256 and sha since CouchDB 3.3, sha1
    only before (docs.couchdb.org config/auth.html, hash_algorithms)."""
    text = _get(config, "chttpd_auth", "hash_algorithms")
    if text:
        return [a.strip() for a in text.split(",") if a.strip()]
    return ["sha256", "sha"] if _version(welcome) >= (3, 3) else ["sha"]


def check_require_valid_user(config: Mapping[str, Mapping[str, str]]) -> Finding:
    """ASO wants anonymous requests answered by each database's `_security` (closed, but for
    the pages' database), with the list of databases kept to the admin."""
    # Since 3.2 in [chttpd]; before in [couch_httpd_auth] (docs: config/auth.html).
    value = _get(config, "chttpd", "require_valid_user") or _get(
        config, "couch_httpd_auth", "require_valid_user"
    )
    if _true(value):
        return Finding(
            WARN,
            "require_valid_user",
            "true: the monitoring pages' login page cannot load without credentials (a "
            "certificate through the front end still opens them); set [chttpd] "
            "require_valid_user = false (each database's _security is checked below)",
        )
    if (_get(config, "chttpd", "admin_only_all_dbs") or "true").strip().lower() != "true":
        return Finding(
            WARN,
            "require_valid_user",
            "false with admin_only_all_dbs = false: anyone lists the databases; set [chttpd] "
            "admin_only_all_dbs = true",
        )
    return Finding(
        OK,
        "require_valid_user",
        "false: anonymous requests meet each database's _security (only the pages' is public)",
    )


def check_users_db_security(config: Mapping[str, Mapping[str, str]]) -> Finding:
    """`aso db init` keeps `_users` to the admin (designdocs.USERS_SECURITY): CouchDB lets it
    only with this setting, and takes a sign-up from any authenticated user without it."""
    if _true(_get(config, "couchdb", "users_db_security_editable")):
        return Finding(OK, "users_db_security_editable", "true: _users is kept to the admin")
    return Finding(
        ERROR,
        "users_db_security_editable",
        "false: any store user may make accounts in _users (one under a grid user's name locks "
        "that user out of the front end); set [couchdb] users_db_security_editable = true, "
        "then run `aso db init`",
    )


def _document_size_finding(size: int, needed: int) -> Finding:
    if size < needed:
        return Finding(
            ERROR,
            "max_document_size",
            f"{size} bytes: ASO writes documents that need {needed} ([couchdb] "
            "max_document_size; deploy/couchdb/local.ini has 8000000)",
        )
    return Finding(OK, "max_document_size", f"{size} bytes (ASO needs {needed})")


def check_request_size(config: Mapping[str, Mapping[str, str]], expected: Expected) -> Finding:
    # [chttpd] since 3.2, [httpd] before; CouchDB 3's default is 4 GB.
    text = _get(config, "chttpd", "max_http_request_size") or _get(
        config, "httpd", "max_http_request_size"
    )
    size = _int(text) if text else 4294967296
    if size is None or size < expected.max_body:
        return Finding(
            ERROR,
            "max_http_request_size",
            f"{text}: the front end forwards bodies up to frontend.max_body = "
            f"{expected.max_body} bytes ([chttpd] max_http_request_size)",
        )
    return Finding(
        OK, "max_http_request_size", f"{size} bytes (frontend.max_body {expected.max_body})"
    )


def check_os_process_timeout(config: Mapping[str, Mapping[str, str]]) -> Finding:
    value = _int(_get(config, "couchdb", "os_process_timeout"))
    limit = _get(config, "query_server_config", "os_process_limit") or "100"
    if value is None:
        value = DEFAULT_OS_PROCESS_TIMEOUT_MS
    text = f"{value} ms, os_process_limit {limit}"
    if value < DEFAULT_OS_PROCESS_TIMEOUT_MS:
        return Finding(
            WARN,
            "JS query server",
            f"{text}: below CouchDB's 5000 ms; validate_doc_update of a bulk write under load "
            "may time out (deploy/couchdb/local.ini has 20000)",
        )
    return Finding(OK, "JS query server", text)


def check_js_engine(config: Mapping[str, Mapping[str, str]], welcome: Mapping[str, Any]) -> Finding:
    """Every write ASO makes runs validate_doc_update in a JavaScript process: on CouchDB 3.4
    QuickJS takes about 3x the validated writes per second of SpiderMonkey (the default)."""
    engine = _get(config, "couchdb", "js_engine") or "spidermonkey"
    if engine == "quickjs":
        return Finding(OK, "JS engine", "quickjs")
    if _version(welcome) < (3, 4):
        return Finding(
            OK,
            "JS engine",
            f"{engine} (CouchDB {welcome.get('version', '?')} has no other; 3.4's quickjs takes"
            " about 3x the validated writes per second)",
        )
    return Finding(
        WARN,
        "JS engine",
        f"{engine}: every write's validation runs about 3x slower than with quickjs, the"
        " store's ceiling at high load; set [couchdb] js_engine = quickjs"
        " (deploy/couchdb/local.ini)",
    )


def check_attachments_csp(config: Mapping[str, Mapping[str, str]]) -> Finding:
    """COUCHDB_ATTACHMENTS_CSP: CouchDB serves attachments with `Content-Security-Policy:
    sandbox` unless told otherwise; the monitoring pages' app.js then never runs."""
    fix = f'[csp] attachments_header_value = "{ATTACHMENTS_CSP}" (deploy/couchdb/local.ini)'
    enabled = _get(config, "csp", "attachments_enable")
    if enabled is not None and not _true(enabled):
        return Finding(
            WARN,
            "attachments CSP",
            "off: the monitoring pages run, but so would any attachment's script; set "
            f"[csp] attachments_enable = true and {fix}",
        )
    value = _get(config, "csp", "attachments_header_value") or "sandbox"
    if "sandbox" in value.lower() and "allow-scripts" not in value.lower():
        return Finding(
            ERROR,
            "attachments CSP",
            f"{value!r}: the monitoring pages stay blank (their script may not run); {fix}",
        )
    if "script-src" in value and "'self'" not in value.split("script-src", 1)[1].split(";")[0]:
        return Finding(
            ERROR,
            "attachments CSP",
            f"{value!r}: script-src does not allow 'self' (the pages' app.js); {fix}",
        )
    return Finding(OK, "attachments CSP", f"{value}: the monitoring pages' own script runs")


def _bind_finding(address: str, item: str) -> Finding:
    if _is_loopback(address):
        return Finding(OK, item, f"{address}: loopback only")
    return Finding(
        WARN,
        item,
        f"{address}: reachable from the network; firewall it so that only the front end, the "
        "agent hosts and the other cluster nodes reach it",
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_cluster_defaults(config: Mapping[str, Mapping[str, str]], nodes: int) -> list[Finding]:
    q, n = _get(config, "cluster", "q"), _int(_get(config, "cluster", "n"))
    text = f"defaults q={q}, n={n}"
    if n is None:
        return [Finding(WARN, "cluster q/n", f"{text}: [cluster] n is not set")]
    return [_copies_finding("cluster q/n", text, n, nodes)]


def _copies_finding(item: str, text: str, n: int, nodes: int) -> Finding:
    if nodes > 1 and n < 2:
        return Finding(
            WARN,
            item,
            f"{text} on a {nodes}-node cluster: one copy of each document, a node down makes "
            "part of the data unavailable (n=3 on 3 nodes)",
        )
    if n > nodes:
        return Finding(
            WARN,
            item,
            f"{text} with {nodes} node(s): fewer copies than n exist; writes answer 202 "
            "(n=1 on a single node)",
        )
    return Finding(OK, item, text)


def check_databases(answers: Answers, expected: Expected) -> list[Finding]:
    if answers.config_error == NOT_ADMIN:
        return []
    nodes = len(_members(answers.membership)) or 1
    findings = []
    for name, spec in expected.databases.items():
        got = answers.databases.get(name)
        if got is None or got.info is None:
            findings.append(Finding(ERROR, f"database {name}", "missing: run `aso db init`"))
            continue
        findings.append(_database_finding(name, got.info, nodes, answers.kind))
        if name.startswith("_"):
            findings.append(check_system_security(name, got.security))
        else:
            findings.append(check_security(name, got.security, spec.security))
        findings += check_design(name, got.design, spec.design)
    for name, security in answers.system_databases.items():
        if security is not None:
            findings.append(check_system_security(name, security))
    return findings


def _database_finding(name: str, info: Mapping[str, Any], nodes: int, kind: str) -> Finding:
    docs = f"{info.get('doc_count', '?')} documents, {info.get('doc_del_count', 0)} deleted"
    cluster = info.get("cluster")
    if kind == EMBEDDED or not isinstance(cluster, Mapping):
        return Finding(OK, f"database {name}", docs)
    n = int(cluster.get("n", 1))
    text = f"q={cluster.get('q')}, n={n}; {docs}"
    return _copies_finding(f"database {name}", text, n, nodes)


def check_security(name: str, security: Mapping[str, Any], wanted: Mapping[str, Any]) -> Finding:
    """Open (no members: anyone may read and write, CouchDB's rule) is an error, but where ASO
    wants it so (the pages' database, which its validation keeps read-only); so is a member or
    admin role that ASO gives and the database lacks."""
    item = f"database {name} _security"
    members = security.get("members") or {}
    wanted_members = wanted.get("members") or {}
    public = not (wanted_members.get("names") or wanted_members.get("roles"))
    if public and not (members.get("names") or members.get("roles")):
        # The pages' database: read by anyone, written by no one (its design document's
        # validate_doc_update, checked with the design documents).
        return Finding(OK, item, "public to read (the monitoring pages); only the admin writes")
    if not (members.get("names") or members.get("roles")):
        return Finding(
            ERROR, item, "open: no members, anonymous users may read and write; run `aso db init`"
        )
    missing = []
    for part in ("admins", "members"):
        have = security.get(part) or {}
        for kind in ("names", "roles"):
            lacking = set((wanted.get(part) or {}).get(kind) or []) - set(have.get(kind) or [])
            missing += [f"{part} {kind} {x}" for x in sorted(lacking)]
    if missing:
        return Finding(ERROR, item, f"lacks {', '.join(missing)}; run `aso db init`")
    extra = [
        f"{kind} {x}"
        for kind in ("names", "roles")
        for x in sorted(set((security.get("admins") or {}).get(kind) or [])
                        - set((wanted.get("admins") or {}).get(kind) or []))
    ]  # fmt: skip
    if extra:
        return Finding(ERROR, item, f"admins {', '.join(extra)}: a database's admins write its "
                       "design documents, code the store runs; run `aso db init`")  # fmt: skip
    roles = ", ".join(members.get("roles") or [])
    return Finding(OK, item, f"members {roles}")


def admitted(security: Mapping[str, Any]) -> list[str]:
    """Who besides the server admins may read or write a database with this `_security`
    (CouchDB's rule: no members, anyone; a database's admins are members too)."""
    members = security.get("members") or {}
    if not (members.get("names") or members.get("roles")):
        return ["anyone (no members)"]
    who = []
    for part in ("admins", "members"):
        section = security.get(part) or {}
        who += [f"{part} name {name}" for name in section.get("names") or []]
        who += [f"{part} role {role}" for role in section.get("roles") or [] if role != "_admin"]
    return who


def check_system_security(name: str, security: Mapping[str, Any]) -> Finding:
    """A system database of the store (`_users`, `_replicator`, `_global_changes`): closed to
    everyone but the server admins, or an error (EMBEDDED_OPEN_SYSTEM_DATABASES: a replication
    document makes the store connect wherever it says; an account written in `_users` is a
    login)."""
    item = f"database {name} _security"
    who = admitted(security)
    if who:
        return Finding(
            ERROR,
            item,
            f"open to {', '.join(who)}: a store user may read or write the store's own "
            "database; run `aso db init` (it keeps it to the admin)",
        )
    return Finding(OK, item, "kept to the server admins")


def check_design(
    name: str, stored: Mapping[str, Any], wanted: Iterable[Mapping[str, Any]]
) -> list[Finding]:
    findings = []
    for ddoc in wanted:
        doc_id = ddoc["_id"]
        item = f"database {name} {doc_id}"
        current = stored.get(doc_id)
        if current is None:
            findings.append(Finding(ERROR, item, "missing: run `aso db init`"))
        elif current.get("aso_signature") != store_admin.design_signature(ddoc):
            findings.append(Finding(ERROR, item, "not this ASO version's: run `aso db init`"))
        else:
            findings.append(Finding(OK, item, "up to date"))
    return findings


def check_agent(answers: Answers, expected: Expected) -> list[Finding]:
    if not expected.agent_user:
        return [Finding(WARN, "agent account", "store.agent_user is empty")]
    item = f"agent account {expected.agent_user}"
    account = answers.agent_account
    if account is None:
        return [Finding(ERROR, item, "missing from _users: run `aso db init`")]
    if model.AGENT_ROLE not in (account.get("roles") or []):
        return [Finding(ERROR, item, f"lacks the role {model.AGENT_ROLE}: run `aso db init`")]
    if answers.agent_password_works is False:
        return [Finding(ERROR, item, "store.agent_password is refused: run `aso db init`")]
    tried = "" if answers.agent_password_works is None else ", its password works"
    return [Finding(OK, item, f"role {model.AGENT_ROLE}{tried}")]


# --- outcome ------------------------------------------------------------------------------------
def exit_code(findings: Iterable[Finding]) -> int:
    """0: fit for ASO (warnings allowed); 1: at least one error."""
    return 1 if any(f.level == ERROR for f in findings) else 0


def as_json(answers: Answers, findings: list[Finding]) -> dict[str, Any]:
    counts = {level: sum(f.level == level for f in findings) for level in LEVELS}
    return {
        "url": answers.url,
        "kind": answers.kind,
        "version": answers.welcome.get("version"),
        "ok": exit_code(findings) == 0,
        "counts": counts,
        "findings": [asdict(f) for f in findings],
    }
