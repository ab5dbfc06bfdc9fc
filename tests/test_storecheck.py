"""`aso store check`: against the embedded store (the real command, as a subprocess), and its
analysis with answers shaped like Apache CouchDB 3's documented responses (GET /,
/_session, /_membership, /_node/{node}/_config, /db, /db/_security), for the branches only a
CouchDB cluster reaches."""

from __future__ import annotations

import configparser
import copy
import dataclasses
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aso.cli.storecheck import split_credentials
from aso.config import Config
from aso.local import couchdb
from aso.local.stores import free_port
from aso.provision import store_check
from aso.provision.designdocs import SYSTEM_SECURITY, init_databases
from aso.provision.store_check import (
    ATTACHMENTS_CSP,
    ERROR,
    OK,
    WARN,
    Answers,
    DatabaseAnswers,
    Finding,
)
from aso.store import Server
from aso.store import admin as store_admin
from tests.conftest import make_config, only_on, write_config
from tests.test_cli import aso, one_line_error

NODES = ["couchdb@couch1.example.org", "couchdb@couch2.example.org", "couchdb@couch3.example.org"]
SECRET = "92de07df7e7a3fe14808cef90a7cc0d91"


# --- against the embedded store ------------------------------------------------------------
@pytest.fixture(scope="module")
def checked_config(store_config: Config, admin: Server, tmp_path_factory) -> Iterator[Path]:
    """A config file whose databases `aso db init` made on the session's embedded store."""
    suffix = uuid.uuid4().hex[:8]
    config = dataclasses.replace(
        store_config,
        source=tmp_path_factory.mktemp("check") / "aso.toml",
        store=dataclasses.replace(
            store_config.store,
            files_db=f"check_files_{suffix}",
            transfers_db=f"check_jobs_{suffix}",
            catalog_db=f"check_catalog_{suffix}",
            stats_db=f"check_stats_{suffix}",
        ),
    )
    init_databases(admin, config)
    yield write_config(config)
    for name in (config.store.files_db, config.store.transfers_db, config.store.catalog_db,
                 config.store.stats_db):  # fmt: skip
        store_admin.delete_db(admin, name)


@only_on("pouchdb", "the embedded store's differences are its own")
def test_embedded_store_is_fit_and_its_differences_are_warnings(checked_config):
    result = aso("store", "check", config=checked_config)
    assert result.returncode == 0, result.stdout + result.stderr
    for name, _ in store_check.EMBEDDED_WARNINGS:
        assert name in result.stdout
    assert "fit for ASO: 0 error(s), 6 warning(s)" in result.stdout
    report = json.loads(aso("store", "check", "--json", config=checked_config).stdout)
    assert report["kind"] == "pouchdb-server" and report["ok"] is True
    warned = {f["detail"].split(":")[0] for f in report["findings"] if f["level"] == WARN}
    assert warned == {name for name, _ in store_check.EMBEDDED_WARNINGS}
    assert report["counts"]["error"] == 0
    assert any(f["item"].endswith("_design/asyncstageout") and f["level"] == OK
               for f in report["findings"])  # fmt: skip


@only_on("couchdb", "the settings checked are CouchDB's")
def test_the_local_couchdb_is_fit_with_nothing_to_fix(checked_config):
    """The local CouchDB that `aso store start` runs (aso/local/couchdb.py, the settings of
    deploy/couchdb/local.ini): every setting ASO depends on is ok, the attachments' CSP too."""
    report = json.loads(aso("store", "check", "--json", config=checked_config).stdout)
    assert report["kind"] == "couchdb" and report["ok"] is True
    assert report["counts"]["error"] == 0 and report["counts"]["warn"] == 0, report["findings"]
    ok = {f["item"] for f in report["findings"] if f["level"] == OK}
    wanted = {"auth handlers", "proxy authentication", "require_valid_user", "max_document_size",
              "max_http_request_size", "JS query server", "attachments CSP", "bind", "cluster",
              "cluster q/n", "agent account aso-agent", "JS engine"}  # fmt: skip
    assert wanted <= ok, wanted - ok
    [engine] = [f for f in report["findings"] if f["item"] == "JS engine"]
    assert engine["detail"] == "quickjs", engine


def test_an_open_database_is_an_error(checked_config, admin):
    from aso.config import load

    name = load(str(checked_config)).store.stats_db
    db = admin.db(name)
    kept = store_admin.security(db)
    store_admin.set_security(db, {"admins": {}, "members": {}})
    try:
        result = aso("store", "check", config=checked_config)
    finally:
        store_admin.set_security(db, kept)
    assert result.returncode == 1
    assert f"database {name} _security" in result.stdout and "open: no members" in result.stdout
    assert aso("store", "check", config=checked_config).returncode == 0


def test_an_open_system_database_is_reported_and_db_init_closes_it(checked_config, admin):
    """EMBEDDED_OPEN_SYSTEM_DATABASES: a system database of the store (here `_replicator`, which
    both stores have) open to store users is an error that says its fix; `aso db init` keeps it
    to the admin, and the check passes again. Through the commands, as an operator runs them."""
    replicator = admin.db("_replicator")
    system = {name for name in store_admin.all_dbs(admin) if name.startswith("_")}
    store_admin.set_security(replicator, {"admins": {}, "members": {"roles": ["aso-user"]}})
    result = aso("store", "check", config=checked_config)
    assert result.returncode == 1, result.stdout + result.stderr
    [line] = [ln for ln in result.stdout.splitlines() if "database _replicator _security" in ln]
    assert "error" in line and "open to members role aso-user" in line
    assert "run `aso db init`" in line
    store_admin.set_security(replicator, {})  # as the embedded store makes it: open to anyone
    result = aso("store", "check", config=checked_config)
    assert result.returncode == 1 and "open to anyone (no members)" in result.stdout

    init = aso("db", "init", config=checked_config)
    assert init.returncode == 0, init.stdout + init.stderr
    assert "system database _replicator kept to the admin" in init.stdout + init.stderr
    result = aso("store", "check", config=checked_config)
    assert result.returncode == 0, result.stdout + result.stderr
    [line] = [ln for ln in result.stdout.splitlines() if "database _replicator _security" in ln]
    assert line.startswith("ok") and "kept to the server admins" in line
    assert store_admin.security(replicator)["members"] == {"names": [], "roles": ["_admin"]}
    # Nothing left to close: db init says nothing of it; it made no system database.
    again = aso("db", "init", config=checked_config)
    assert "kept to the admin" not in again.stdout + again.stderr
    assert {name for name in store_admin.all_dbs(admin) if name.startswith("_")} == system


def test_a_non_admin_account_cannot_check_everything(checked_config, store_config):
    result = aso(
        "store", "check", "--user", "aso-agent", "--password", store_config.store.agent_password,
        config=checked_config,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "is not a server admin" in result.stdout and not result.stderr


def test_wrong_credentials_are_one_line(checked_config, store_config):
    bad = store_config.store.url.replace("http://", "http://admin:not-the-password@")
    for args in ([bad], [store_config.store.url, "--user", "admin", "--password", "nope"]):
        result = aso("store", "check", *args, config=checked_config)
        assert result.returncode == 1, result.stdout + result.stderr
        line = one_line_error(result)
        assert "refused the credentials of admin" in line
        assert "not-the-password" not in line and not result.stdout


def test_an_unreachable_store_is_one_line(tmp_path):
    config = make_config(tmp_path, free_port(), retries=1)
    path = write_config(config)
    result = aso("store", "check", config=path)
    assert result.returncode != 0
    assert f"cannot reach the store at {config.store.url}" in one_line_error(result)
    nobody = f"http://127.0.0.1:{free_port()}"
    result = aso("store", "check", nobody, config=path)
    assert result.returncode != 0 and nobody in one_line_error(result)


def test_split_credentials():
    assert split_credentials("http://a%40b:p%3Aw@h:5984/x") == ("http://h:5984/x", "a@b", "p:w")
    assert split_credentials("http://h:5984") == ("http://h:5984", None, None)
    assert split_credentials("http://u@[::1]:5984") == ("http://[::1]:5984", "u", "")


# --- CouchDB 3 answers ----------------------------------------------------------------------
def proxy_config() -> Config:
    config = Config()
    config.frontend.auth = "proxy"
    config.frontend.secret = SECRET
    return config


def node_config(**changes: dict[str, str]) -> dict[str, dict[str, str]]:
    """`GET /_node/{node}/_config` of a node set up with deploy/couchdb/local.ini: every value
    a string, as CouchDB sends them."""
    config = {
        "couchdb": {"max_document_size": "8000000", "os_process_timeout": "20000",
                    "single_node": "false", "uuid": "0a959b9b8227188afc2ac26ccdf345a6",
                    "users_db_security_editable": "true", "js_engine": "quickjs"},
        "chttpd": {"bind_address": "10.0.0.11", "port": "5984", "require_valid_user": "false",
                   "admin_only_all_dbs": "true", "max_http_request_size": "4294967296",
                   "authentication_handlers": "{chttpd_auth, proxy_authentication_handler}, "
                   "{chttpd_auth, cookie_authentication_handler}, "
                   "{chttpd_auth, default_authentication_handler}"},
        "chttpd_auth": {"proxy_use_secret": "true", "secret": SECRET,
                        "hash_algorithms": "sha256, sha"},
        "cluster": {"q": "8", "n": "3"},
        "csp": {"attachments_enable": "true", "attachments_header_value": ATTACHMENTS_CSP},
        "query_server_config": {"os_process_limit": "200", "reduce_limit": "true"},
        "admins": {"admin": "-pbkdf2-43ecbd256a70a3a2f7de40d2374b6c3002918834,921a12f7,10000"},
    }  # fmt: skip
    for section, values in changes.items():
        config.setdefault(section, {}).update(values)
    return config


def couchdb_answers(config: Config, *, n: int = 3, version: str = "3.4.3") -> Answers:
    """A healthy 3-node CouchDB cluster that `aso db init` set up for `config`."""
    expected = store_check.expected_of(config)
    databases = {}
    for name, spec in expected.databases.items():
        info = {"db_name": name, "doc_count": 1200, "doc_del_count": 300, "update_seq":
                "1500-g1AAAAFTeJzLYWBg4MhgTmEQTM4vTc5ISXIwNDLXMzIwMjfOs", "purge_seq": 0,
                "sizes": {"active": 1048576, "external": 2097152, "file": 4194304},
                "props": {}, "instance_start_time": "0", "disk_format_version": 8,
                "compact_running": False, "cluster": {"q": 8, "n": n, "w": 2, "r": 2}}  # fmt: skip
        design = {d["_id"]: dict(d, _rev="1-abc", aso_signature=store_admin.design_signature(d))
                  for d in spec.design}  # fmt: skip
        databases[name] = DatabaseAnswers(info, copy.deepcopy(dict(spec.security)), design)
    return Answers(
        url="http://couch.example.org:5984",
        welcome={
            "couchdb": "Welcome",
            "version": version,
            "git_sha": "6e5ad2a5c",
            "uuid": "0a959b9b8227188afc2ac26ccdf345a6",
            "features": [
                "access-ready",
                "partitioned",
                "pluggable-storage-engines",
                "reshard",
                "scheduler",
            ],
            "vendor": {"name": "The Apache Software Foundation"},
        },
        session={"name": "admin", "roles": ["_admin"]},
        membership={"all_nodes": list(NODES), "cluster_nodes": list(NODES)},
        configs={node: node_config() for node in NODES},
        databases=databases,
        agent_account={
            "_id": "org.couchdb.user:aso-agent",
            "name": "aso-agent",
            "type": "user",
            "roles": ["aso-agent"],
        },
        agent_password_works=True,
    )


def analyse(answers: Answers, config: Config) -> list[Finding]:
    return store_check.analyse(answers, store_check.expected_of(config))


def at(findings: list[Finding], level: str, words: str) -> list[Finding]:
    return [f for f in findings if f.level == level and words in f"{f.item}: {f.detail}"]


def test_a_healthy_cluster_passes():
    config = proxy_config()
    findings = analyse(couchdb_answers(config), config)
    assert store_check.exit_code(findings) == 0, [f for f in findings if f.level != OK]
    assert not at(findings, ERROR, "")
    assert at(findings, OK, "3 nodes, all connected")
    assert len(at(findings, OK, "on, with the front end's secret and hash")) == 3  # every node
    assert at(findings, OK, "q=8, n=3")
    # The nodes listen on a private address: said, not an error.
    assert {f.level for f in findings if f.item.endswith("bind")} == {WARN}


def test_users_open_to_sign_ups_is_an_error_with_its_fix():
    """Issue 18, finding 8: `_users` kept to the admin needs CouchDB's
    users_db_security_editable; without it (or with `_users` open) `aso store check` fails."""
    config = proxy_config()
    answers = couchdb_answers(config)
    answers.configs = {
        node: node_config(couchdb={"users_db_security_editable": "false"}) for node in NODES
    }
    answers.databases["_users"].security = {"members": {"names": [], "roles": []}}
    findings = analyse(answers, config)
    assert len(at(findings, ERROR, "set [couchdb] users_db_security_editable = true")) == 3
    assert at(findings, ERROR, "database _users _security: open to anyone (no members)")
    assert store_check.exit_code(findings) == 1


def test_a_system_database_open_to_anyone_but_the_admin_is_an_error():
    """Members or admins other than `_admin` (a name, an ASO role) open a system database as
    much as no members at all; a system database the store does not have is not reported."""
    config = proxy_config()
    answers = couchdb_answers(config)
    answers.system_databases = {"_replicator": dict(SYSTEM_SECURITY), "_global_changes": None}
    findings = analyse(answers, config)
    assert at(findings, OK, "database _replicator _security: kept to the server admins")
    assert not at(findings, OK, "_global_changes") and not at(findings, ERROR, "_global_changes")
    assert store_check.exit_code(findings) == 0
    opened = [
        ({}, "open to anyone (no members)"),
        ({"members": {"roles": ["_admin", "aso-user"]}}, "open to members role aso-user"),
        ({"members": {"roles": ["_admin"]}, "admins": {"names": ["eve"]}}, "admins name eve"),
    ]
    for security, words in opened:
        answers.system_databases["_replicator"] = security
        findings = analyse(answers, config)
        [error] = at(findings, ERROR, "database _replicator _security")
        assert words in error.detail and "run `aso db init`" in error.detail


def test_a_member_that_is_not_connected_is_an_error():
    config = proxy_config()
    answers = couchdb_answers(config)
    answers.membership = {"all_nodes": NODES[:2], "cluster_nodes": list(NODES)}
    findings = analyse(answers, config)
    assert at(findings, ERROR, f"member {NODES[2]} is not connected")
    assert store_check.exit_code(findings) == 1


def test_one_copy_on_a_cluster_is_a_warning():
    config = proxy_config()
    answers = couchdb_answers(config, n=1)
    findings = analyse(answers, config)
    assert len(at(findings, WARN, "n=1; 1200 documents")) == 7  # each ASO database and _users
    assert store_check.exit_code(findings) == 0
    answers.configs = {node: node_config(cluster={"n": "1"}) for node in NODES}
    assert len(at(analyse(answers, config), WARN, "defaults q=8, n=1 on a 3-node cluster")) == 3
    # n=1 is right on a single node.
    single = couchdb_answers(config, n=1)
    single.membership = {"all_nodes": NODES[:1], "cluster_nodes": NODES[:1]}
    single.configs = {NODES[0]: node_config(cluster={"n": "1"})}
    findings = analyse(single, config)
    assert not at(findings, WARN, "n=1") and at(findings, OK, "single node")


def test_proxy_auth_off_while_the_front_end_uses_it_is_an_error():
    config = proxy_config()
    answers = couchdb_answers(config)
    off = node_config(chttpd={"authentication_handlers": store_check.DEFAULT_HANDLERS})
    answers.configs[NODES[1]] = off
    findings = analyse(answers, config)
    errors = at(findings, ERROR, "needs {chttpd_auth, proxy_authentication_handler}")
    assert [f.item for f in errors] == [f"{NODES[1]}: proxy authentication"]
    # The same store is fine for a front end in session mode.
    config.frontend.auth = "session"
    assert store_check.exit_code(analyse(answers, config)) == 0


@pytest.mark.parametrize(
    ("chttpd_auth", "words"),
    [
        ({"proxy_use_secret": "false"}, "anyone who reaches the store can claim any user"),
        ({"secret": ""}, "anyone who reaches the store can claim any user"),
        ({"secret": "another-secret"}, "[chttpd_auth] secret is not frontend.secret"),
        ({"hash_algorithms": "sha"}, "frontend.proxy_hash sha256 is not in"),
        ({"x_auth_token": "X-Proxy-Token"}, "the front end sends X-Auth-CouchDB-Token"),
    ],
)
def test_proxy_auth_that_the_front_end_cannot_use_is_an_error(chttpd_auth, words):
    config = proxy_config()
    answers = couchdb_answers(config)
    answers.configs = {node: node_config(chttpd_auth=chttpd_auth) for node in NODES}
    findings = analyse(answers, config)
    assert len(at(findings, ERROR, words)) == 3
    assert SECRET not in json.dumps(store_check.as_json(answers, findings))  # never shown


def test_proxy_hash_default_follows_the_version():
    config = proxy_config()
    answers = couchdb_answers(config, version="3.2.2")
    answers.configs = {n: node_config() for n in NODES}
    for node in NODES:
        del answers.configs[node]["chttpd_auth"]["hash_algorithms"]
    assert at(analyse(answers, config), ERROR, "not in [chttpd_auth] hash_algorithms (sha)")
    answers.welcome["version"] = "3.4.3"
    assert store_check.exit_code(analyse(answers, config)) == 0


def test_open_or_incomplete_security_is_an_error():
    config = proxy_config()
    answers = couchdb_answers(config)
    files, jobs = config.store.files_db, config.store.transfers_db
    answers.databases[files].security = {}
    # What CouchDB 3 gives a new database (default_security = admin_only): closed, not ASO's.
    answers.databases[jobs].security = {"members": {"roles": ["_admin"]},
                                        "admins": {"roles": ["_admin"]}}  # fmt: skip
    findings = analyse(answers, config)
    assert at(findings, ERROR, f"database {files} _security: open: no members")
    lacking = at(findings, ERROR, f"database {jobs} _security: lacks members roles aso-admin")
    assert lacking and "members roles aso-agent" in lacking[0].detail
    # A database admin role (as `aso db init` gave aso-admin before): it writes design documents.
    answers.databases[jobs].security = {"members": {"roles": ["aso-agent", "aso-admin"]},
                                        "admins": {"roles": ["aso-admin"]}}  # fmt: skip
    findings = analyse(answers, config)
    assert at(findings, ERROR, f"database {jobs} _security: admins roles aso-admin: a database's")


def test_too_small_documents_or_requests_are_errors():
    config = proxy_config()
    answers = couchdb_answers(config)
    answers.configs = {
        node: node_config(
            couchdb={"max_document_size": "65536 ; bytes"},
            chttpd={"max_http_request_size": "1048576"},
        )
        for node in NODES
    }
    findings = analyse(answers, config)
    needed = store_check.ERLANG_OVERHEAD * store_check.largest_document(config)
    assert len(at(findings, ERROR, f"65536 bytes: ASO writes documents that need {needed}")) == 3
    assert len(at(findings, ERROR, "up to frontend.max_body = 67108864")) == 3


def test_other_settings_and_version():
    config = proxy_config()
    answers = couchdb_answers(config)
    answers.configs = {
        node: node_config(couchdb={"os_process_timeout": "1000"}, chttpd={
            "require_valid_user": "true", "bind_address": "127.0.0.1"})
        for node in NODES
    }  # fmt: skip
    findings = analyse(answers, config)
    assert len(at(findings, WARN, "1000 ms, os_process_limit 200: below")) == 3
    assert len(at(findings, WARN, "true: the monitoring pages' login page cannot load")) == 3
    for node in NODES:
        answers.configs[node]["chttpd"].update(
            require_valid_user="false", admin_only_all_dbs="false"
        )
    assert len(at(analyse(answers, config), WARN, "anyone lists the databases")) == 3
    for node in NODES:
        answers.configs[node]["chttpd"]["admin_only_all_dbs"] = "true"
    assert len(at(findings, OK, "127.0.0.1: loopback only")) == 3
    answers.welcome["version"] = "2.3.1"
    assert at(analyse(answers, config), ERROR, "ASO needs Apache CouchDB 3")


def test_the_javascript_engine_is_quickjs_where_couchdb_has_it():
    """SpiderMonkey (CouchDB's default) runs every write's validation about 3x slower than
    QuickJS: a warning with the fix on 3.4; the only engine before 3.4, so nothing to fix."""
    config = proxy_config()
    answers = couchdb_answers(config)
    answers.welcome["version"] = "3.4.3"
    for engine, level in ((None, WARN), ("spidermonkey", WARN), ("quickjs", OK)):
        answers.configs = {node: node_config() for node in NODES}
        for node in NODES:
            answers.configs[node]["couchdb"].pop("js_engine")
            if engine:
                answers.configs[node]["couchdb"]["js_engine"] = engine
        findings = [f for f in analyse(answers, config) if f.item.endswith(": JS engine")]
        assert [f.level for f in findings] == [level] * 3, findings
        if level == WARN:
            assert "js_engine = quickjs" in findings[0].detail
    answers.welcome["version"] = "3.3.3"
    for node in NODES:
        answers.configs[node]["couchdb"].pop("js_engine")
    findings = [f for f in analyse(answers, config) if f.item.endswith(": JS engine")]
    assert [f.level for f in findings] == [OK] * 3 and "has no other" in findings[0].detail


def test_design_documents_and_agent_account():
    config = proxy_config()
    answers = couchdb_answers(config)
    design = answers.databases[config.store.files_db].design
    design["_design/queue"] = dict(design["_design/queue"], aso_signature="old")
    design["_design/stats"] = None
    answers.agent_password_works = False
    findings = analyse(answers, config)
    assert at(findings, ERROR, "_design/queue: not this ASO version's")
    assert at(findings, ERROR, "_design/stats: missing")
    assert at(findings, ERROR, "store.agent_password is refused")
    answers.agent_account = None
    assert at(analyse(answers, config), ERROR, "agent account aso-agent: missing")


def test_a_missing_database_is_an_error():
    config = proxy_config()
    answers = couchdb_answers(config)
    answers.databases[config.store.catalog_db] = DatabaseAnswers(info=None)
    findings = analyse(answers, config)
    assert at(findings, ERROR, f"database {config.store.catalog_db}: missing")


def test_the_embedded_store_cannot_do_proxy_auth():
    config = proxy_config()
    answers = Answers(
        url="http://127.0.0.1:5984",
        welcome={
            "express-pouchdb": "Welcome!",
            "version": "4.2.0",
            "vendor": {"name": "PouchDB authors", "version": "4.2.0"},
        },
        session={"name": "admin", "roles": ["_admin"]},
        membership={"all_nodes": ["node1@127.0.0.1"], "cluster_nodes": ["node1@127.0.0.1"]},
        configs={"_local": {"couchdb": {"max_document_size": "4294967296"}}},
    )
    findings = analyse(answers, config)
    assert at(findings, ERROR, 'EMBEDDED_IGNORES_PROXY_AUTH): use "session"')
    config.frontend.auth = "session"
    findings = analyse(answers, config)
    assert not at(findings, ERROR, "proxy")
    assert len(at(findings, WARN, "EMBEDDED_")) == len(store_check.EMBEDDED_WARNINGS)


def test_the_checked_databases_are_those_db_init_makes(checked_config, admin):
    """expected_databases and init_databases describe the same databases: every one the
    check expects exists after `aso db init`, with the design documents it expects."""
    from aso.config import load

    config = load(str(checked_config))
    expected = store_check.expected_databases(config)
    assert set(expected) <= set(store_admin.all_dbs(admin))
    for name, spec in expected.items():
        for ddoc in spec.design:
            stored: Any = admin.db(name).get(ddoc["_id"])
            assert stored["aso_signature"] == store_admin.design_signature(ddoc), (
                name,
                ddoc["_id"],
            )


# --- deploy/couchdb ---------------------------------------------------------------------------
DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "couchdb"


def read_ini(*names: str) -> dict[str, dict[str, str]]:
    """The files as CouchDB reads them (later files win, `;` comments), shaped like
    GET /_node/_local/_config."""
    parser = configparser.ConfigParser(inline_comment_prefixes=(";",), interpolation=None)
    parser.read([DEPLOY / name for name in names])
    return {section: dict(parser[section]) for section in parser.sections()}


@pytest.mark.parametrize(
    ("files", "nodes"), [(("local.ini",), 1), (("local.ini", "cluster.ini"), 3)]
)
def test_the_shipped_couchdb_config_passes_the_check(files, nodes):
    config = proxy_config()
    ini = read_ini(*files)
    config.frontend.secret = ini["chttpd_auth"]["secret"]
    welcome = couchdb_answers(config).welcome
    findings = store_check.check_node_config(ini, store_check.expected_of(config), welcome, nodes)
    assert not [f for f in findings if f.level == ERROR], findings
    assert at(findings, OK, "proxy authentication: on, with the front end's secret and hash")
    assert at(findings, OK, f"n={nodes}")
    bind = ini["chttpd"]["bind_address"]
    assert store_check._is_loopback(bind) == (nodes == 1)


def test_the_attachments_csp_that_blanks_the_pages_is_an_error_with_its_fix():
    """COUCHDB_ATTACHMENTS_CSP: CouchDB's default `sandbox` policy stops the pages' script."""
    config = proxy_config()
    expected = store_check.expected_of(config)
    welcome = couchdb_answers(config).welcome
    default = node_config()
    del default["csp"]
    for node, level in ((default, ERROR), (node_config(csp={"attachments_enable": "false"}), WARN),
                        (node_config(), OK)):  # fmt: skip
        findings = store_check.check_node_config(node, expected, welcome, 3)
        csp = [f for f in findings if f.item == "attachments CSP"]
        assert len(csp) == 1 and csp[0].level == level, csp
    blank = at(store_check.check_node_config(default, expected, welcome, 3), ERROR, "blank")
    assert "attachments_header_value" in blank[0].detail and ATTACHMENTS_CSP in blank[0].detail
    no_script = node_config(csp={"attachments_header_value": "script-src 'none'"})
    assert at(store_check.check_node_config(no_script, expected, welcome, 3), ERROR, "script-src")


# Keys of deploy/couchdb/local.ini that each site (or each node) sets for itself: the local
# CouchDB writes them from its config and data directory instead.
PER_NODE = {("couchdb", k) for k in ("single_node", "database_dir", "view_index_dir", "uuid")}
PER_NODE |= {("chttpd", "port"), ("chttpd_auth", "secret"), ("cluster", "n")}


def test_the_local_couchdb_runs_the_settings_of_deploy_local_ini():
    """One set of settings: what `aso store start` writes for a local CouchDB
    (aso/couchdb.SETTINGS) is what deploy/couchdb/local.ini tells operators to install."""
    shipped = read_ini("local.ini")
    normal = lambda v: " ".join(str(v).split())  # noqa: E731
    for section, values in couchdb.SETTINGS.items():
        for key, value in values.items():
            assert normal(shipped.get(section, {}).get(key)) == normal(value), (section, key)
    for section, values in shipped.items():
        if section in ("admins", "log"):
            continue  # per site: the admin's password; the journal under systemd
        for key in values:
            if (section, key) not in PER_NODE:
                assert key in couchdb.SETTINGS.get(section, {}), (section, key)
