"""The X.509 front end (`aso frontend`, a real Twisted HTTPS server in its own process) in front
of the embedded store: which certificates and proxies get in, with what answer, and what the
users behind them may do (the store's validate_doc_update and _security, seen through it)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import types
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests
from cryptography.hazmat.primitives.serialization import Encoding
from playwright.sync_api import expect
from prometheus_client.parser import text_string_to_metric_families

from aso import limits, model, upload
from aso.config import Config
from aso.frontend import server as frontend_module
from aso.frontend import shared as shared_module
from aso.frontend.server import GridMap, MapfileError, Mapped, ProxyAuth
from aso.grid import proxycert
from aso.grid.x509auth import Refused, TrustStore, verify_chain
from aso.local.pki import CertificateAuthority, Pki, make_proxy, write_pkcs12
from aso.local.stores import distinct_free_ports
from aso.model import AGENT, STATE, Change
from aso.provision.designdocs import known_sites, pages_url
from aso.store import Server
from aso.store import admin as store_admin
from tests.browser_helpers import ARTEFACTS, CHROMIUM, browser
from tests.conftest import only_on, sample_request, write_config
from tests.tls_client import client_context, connect

ASO = str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "aso")
PAST = dt.datetime.now(dt.UTC) - dt.timedelta(days=60)
METRICS: dict[str, str] = {}  # front end URL → host:port of its /metrics


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    pki = Pki.create(tmp_path_factory.mktemp("pki"))
    lines = [
        f'"{pki.user(u).dn}" {u}' for u in ("carol", "dave", "erin")
    ] + [  # the revoked user is mapped: only the CRL keeps it out
        f'"{pki.user("agent-host").dn}" agent-host aso-agent',
        f'"{pki.user("operator-x").dn}" operator-x aso-admin',
        f'"{pki.user("mallory").dn}" mallory',
    ]
    (pki.root / "grid-mapfile").write_text("# test\n" + "\n".join(lines) + "\n")
    pki.revoke(pki.user("mallory").cert)
    return pki


PIDS: dict[str, int] = {}  # front end URL → its process


def frontend_config(store_config: Config, pki: Pki, files_db: str, base: Path) -> Config:
    """A front end of its own on free ports (TLS and metrics) before `files_db`."""
    port, metrics_port = distinct_free_ports(2)
    return dataclasses.replace(
        store_config,
        source=base / "aso.toml",
        store=dataclasses.replace(store_config.store, files_db=files_db),
        frontend=dataclasses.replace(
            store_config.frontend,
            listen=f"127.0.0.1:{port}",
            host_cert=str(pki.host_cert),
            host_key=str(pki.host_key),
            capath=str(pki.capath),
            mapfile=str(pki.root / "grid-mapfile"),
            secret="frontend-test-secret",
        ),
        metrics=dataclasses.replace(store_config.metrics, frontend_port=metrics_port),
    )


@contextmanager
def frontend_process(config: Config) -> Iterator[str]:
    """`aso frontend` on `config` (written next to its source), until the block ends; its URL.
    Its log is `frontend.log` in the same directory."""
    assert config.source is not None
    write_config(config)
    log = config.source.parent / "frontend.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [ASO, "--config", str(config.source), "frontend"], stdout=out, stderr=subprocess.STDOUT
        )
    url = f"https://{config.frontend.listen}"
    try:
        deadline = time.monotonic() + 30
        while "listening" not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        PIDS[url] = process.pid
        METRICS[url] = f"127.0.0.1:{config.metrics.frontend_port}"
        yield url
    finally:
        process.terminate()
        process.wait(30)


@pytest.fixture(scope="module")
def frontend(
    store_config: Config, pki: Pki, files_db: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    base = tmp_path_factory.mktemp("frontend")
    with frontend_process(frontend_config(store_config, pki, files_db, base)) as url:
        yield url


def call(url: str, pki: Pki, cert: Any, method: str, path: str, **kw: Any) -> requests.Response:
    return requests.request(
        method, url + path, cert=cert, verify=str(pki.ca_file), timeout=30, **kw
    )


def cert_files(pki: Pki, who: str) -> tuple[str, str]:
    cert, key = pki.write_user(pki.user(who), f"{who}-")
    return str(cert), str(key)


def credentials(pki: Pki, kind: str) -> Any:
    """The client credential of each case, as `requests` takes it."""
    carol = pki.user("carol")
    if kind == "user cert":
        return cert_files(pki, "carol")
    if kind == "proxy":
        return str(pki.proxy_file(carol))
    if kind == "proxy of a proxy":
        return str(pki.write_proxy(make_proxy(make_proxy(carol)), "x509up_pp"))
    if kind == "expired cert":
        old = pki.ca.user("carol", days=30, start=PAST)
        cert, key = pki.write_user(old, "old-carol-")
        return str(cert), str(key)
    if kind == "expired proxy":
        proxy = make_proxy(carol, dt.timedelta(hours=1), start=PAST)
        return str(pki.write_proxy(proxy, "x509up_expired"))
    if kind == "revoked cert":
        return cert_files(pki, "mallory")
    if kind == "untrusted CA":
        rogue = CertificateAuthority("ASO Test CA")  # same name, another key
        cert, key = pki.write_user(rogue.user("carol"), "rogue-carol-")
        return str(cert), str(key)
    if kind == "proxy signed by the wrong key":
        forged = make_proxy(carol, signer=pki.user("dave").key)
        return str(pki.write_proxy(forged, "x509up_forged"))
    if kind == "proxy of a proxy of path length 1":
        return str(pki.write_proxy(make_proxy(make_proxy(carol, path_length=1)), "x509up_pl1"))
    if kind == "proxy of a proxy of path length 0":
        return str(pki.write_proxy(make_proxy(make_proxy(carol, path_length=0)), "x509up_pl0"))
    if kind == "limited proxy":
        return str(pki.write_proxy(make_proxy(carol, policy=proxycert.LIMITED), "x509up_lim"))
    if kind == "full proxy of a limited proxy":
        limited = make_proxy(carol, policy=proxycert.LIMITED)
        return str(pki.write_proxy(make_proxy(limited), "x509up_lim_full"))
    if kind == "independent proxy":
        independent = make_proxy(carol, policy=proxycert.INDEPENDENT)
        return str(pki.write_proxy(independent, "x509up_indep"))
    if kind == "proxy of an unknown policy":
        unknown = make_proxy(carol, policy="1.3.6.1.4.1.99999.1")
        return str(pki.write_proxy(unknown, "x509up_unknown"))
    if kind == "unknown DN":
        return cert_files(pki, "stranger")
    if kind == "no client cert":
        return None
    raise AssertionError(kind)


CASES = [
    ("user cert", 201, None),
    ("proxy", 201, None),
    ("proxy of a proxy", 201, None),
    ("expired cert", 401, "expired on"),
    ("expired proxy", 401, "expired on"),
    ("revoked cert", 401, "is revoked"),
    ("untrusted CA", 401, "is not signed by the CA"),
    ("proxy signed by the wrong key", 401, "not signed by its issuer's key"),
    # RFC 3820 and ASO's proxy policy (aso/grid/proxycert.py)
    ("proxy of a proxy of path length 1", 201, None),
    ("proxy of a proxy of path length 0", 401, "allows 0 proxies after it, the chain has 1"),
    ("limited proxy", 201, None),
    ("full proxy of a limited proxy", 401, "must be limited too"),
    ("independent proxy", 401, "independent proxies are not accepted"),
    ("proxy of an unknown policy", 401, "1.3.6.1.4.1.99999.1 proxies are not accepted"),
    ("unknown DN", 403, "is not mapped to an ASO user"),
    ("no client cert", 401, "client certificate (or proxy) is required"),
]


@pytest.mark.parametrize(("kind", "status", "reason"), CASES, ids=[c[0] for c in CASES])
def test_who_gets_in(frontend, pki, files_db, admin, kind, status, reason):
    who = "mallory" if kind == "revoked cert" else "carol"
    doc = sample_request(who)
    answer = call(frontend, pki, credentials(pki, kind), "POST", f"/{files_db}", json=doc)
    assert answer.status_code == status, answer.text
    stored = admin.db(files_db).get(doc["_id"])
    if reason is None:
        assert stored is not None and stored["user"] == "carol"
    else:
        assert reason in answer.json()["reason"]
        assert stored is None  # nothing written for a refused client


@pytest.mark.parametrize("path_length", [0, 1, 2])
@pytest.mark.parametrize("depth", [2, 3])
def test_proxy_path_lengths_are_judged_as_openssl_judges_them(pki, tmp_path, path_length, depth):
    """RFC 3820: the first proxy's path length caps how many proxies may follow it. The front
    end's verdict on chains of `depth` proxies is the one of `openssl verify -allow_proxy_certs`,
    and a limited proxy comes out flagged."""
    proxy = make_proxy(pki.user("carol"), path_length=path_length)
    for _ in range(depth - 1):
        proxy = make_proxy(proxy, policy=proxycert.LIMITED)
    chain = [proxy.cert, *proxy.chain]
    leaf, untrusted = tmp_path / "leaf.pem", tmp_path / "untrusted.pem"
    leaf.write_bytes(proxy.cert_pem())
    untrusted.write_bytes(b"".join(c.public_bytes(Encoding.PEM) for c in proxy.chain))
    openssl = subprocess.run(
        ["openssl", "verify", "-allow_proxy_certs", "-CApath", str(pki.capath), "-untrusted",
         str(untrusted), str(leaf)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    try:
        identity = verify_chain(chain, TrustStore(pki.capath), require_crl=False)
    except Refused as refused:
        assert openssl.returncode != 0, f"openssl accepted what ASO refused: {refused.reason}"
        assert "proxies after it" in refused.reason
    else:
        assert openssl.returncode == 0, openssl.stdout + openssl.stderr
        assert identity.dn == pki.user("carol").dn and identity.proxies == depth
        assert identity.limited
    assert (openssl.returncode == 0) == (depth - 1 <= path_length)


def test_identity_headers_of_the_client_are_ignored(frontend, pki, files_db, admin, store_config):
    dave = cert_files(pki, "dave")
    forged = {
        "X-Auth-CouchDB-UserName": "admin",
        "X-Auth-CouchDB-Roles": "_admin",
        "X-Auth-CouchDB-Token": "0" * 64,
    }
    auth = (store_config.store.admin_user, store_config.store.admin_password)
    design = {"_id": "_design/evil", "validate_doc_update": "function () {}"}
    answer = call(frontend, pki, dave, "PUT", f"/{files_db}/_design/evil", json=design,
                  headers=forged, auth=auth)  # fmt: skip
    assert answer.status_code in (401, 403), answer.text
    assert admin.db(files_db).get("_design/evil") is None
    session = call(frontend, pki, dave, "GET", "/_session", headers=forged, auth=auth).json()
    assert session["userCtx"] == {"name": "dave", "roles": [model.USER_ROLE]}
    assert "set-cookie" not in {k.lower() for k in session}


def test_one_user_cannot_touch_another_s_requests(frontend, pki, files_db, admin):
    carol, dave = cert_files(pki, "carol"), cert_files(pki, "dave")
    doc = sample_request("carol")
    assert call(frontend, pki, carol, "POST", f"/{files_db}", json=doc).status_code == 201
    current = admin.db(files_db).get(doc["_id"])
    # Bob creating a request in Alice's name.
    forged = sample_request("carol")
    assert call(frontend, pki, dave, "POST", f"/{files_db}", json=forged).status_code == 403
    # Bob killing, resubmitting, editing or deleting Alice's request.
    killed = model.transition(current, [Change(STATE, "killed", "dave")], model.OWNER)
    edited = dict(current, destination_lfn="/store/user/dave/stolen.root")
    for body in (killed, edited):
        answer = call(frontend, pki, dave, "PUT", f"/{files_db}/{doc['_id']}", json=body)
        assert answer.status_code == 403, answer.text
    gone = call(frontend, pki, dave, "DELETE", f"/{files_db}/{doc['_id']}",
                params={"rev": current["_rev"]})  # fmt: skip
    assert gone.status_code == 403
    # Nor design documents or _security.
    design = {"_id": "_design/x", "views": {}}
    assert call(frontend, pki, dave, "PUT", f"/{files_db}/_design/x", json=design).status_code in (
        401,
        403,
    )
    security = {"admins": {"names": ["dave"]}, "members": {"names": ["dave"]}}
    assert call(
        frontend, pki, dave, "PUT", f"/{files_db}/_security", json=security
    ).status_code in (
        401,
        403,
    )
    assert admin.db(files_db).get(doc["_id"])["_rev"] == current["_rev"]
    # Bob may read (a member); Alice may kill her own.
    assert call(frontend, pki, dave, "GET", f"/{files_db}/{doc['_id']}").status_code == 200
    own_kill = model.transition(current, [Change(STATE, "killed", "carol")], model.OWNER)
    mine = call(frontend, pki, carol, "PUT", f"/{files_db}/{doc['_id']}", json=own_kill)
    assert mine.status_code == 201, mine.text


def test_an_upload_naming_an_unknown_site_is_refused_through_the_front_end(
    frontend, pki, files_db, admin, store_config
):
    """Issue 18, finding 7: an upload naming T2_XX_Nowhere had been accepted (201), and the
    submitter then crash-looped on it. The raw API's answer is a 403 with the store's reason,
    in one document or in a `_bulk_docs` of several, and nothing of it is recorded."""
    carol = cert_files(pki, "carol")
    nowhere = sample_request("carol", source="T2_XX_Nowhere")
    answer = call(frontend, pki, carol, "POST", f"/{files_db}", json=nowhere)
    assert answer.status_code == 403, answer.text
    sites = ", ".join(known_sites(store_config))
    assert answer.json()["reason"] == (
        f'[site] source "T2_XX_Nowhere" is not a site of this ASO (its sites: {sites})'
    )
    good, bad = sample_request("carol"), sample_request("carol", destination="T1_XX_Gone")
    bulk = call(frontend, pki, carol, "POST", f"/{files_db}/_bulk_docs", json={"docs": [good, bad]})
    assert bulk.status_code == 201, bulk.text
    results = {row["id"]: row for row in bulk.json()}
    assert "rev" in results[good["_id"]] and "error" not in results[good["_id"]]
    refused = results[bad["_id"]]
    assert refused["error"] == "forbidden", refused
    assert '[site] destination "T1_XX_Gone" is not a site' in refused["reason"]
    stored = admin.db(files_db).get_many([nowhere["_id"], good["_id"], bad["_id"]])
    assert {doc_id for doc_id, doc in stored.items() if doc} == {good["_id"]}


def test_a_creation_s_conflict_tells_the_same_request_from_a_different_file(
    frontend, pki, files_db, admin
):
    """Issue 20: a 409 meant both "already recorded" and "a different file under this id". The
    front end answers each creation's conflict with a reason telling them apart, in the same
    answer (docs/status-api.md), for PUT, POST and _bulk_docs alike."""
    carol = cert_files(pki, "carol")
    doc = sample_request("carol")
    assert (
        call(frontend, pki, carol, "PUT", f"/{files_db}/{doc['_id']}", json=doc).status_code == 201
    )
    for method, path in (("PUT", f"/{files_db}/{doc['_id']}"), ("POST", f"/{files_db}")):
        again = call(frontend, pki, carol, method, path, json=doc)
        assert again.status_code == 409, again.text
        assert again.json() == openapi_example("alreadyRecorded")  # the docs' answer
    other = dict(doc, size=doc["size"] + 1)
    different = call(frontend, pki, carol, "PUT", f"/{files_db}/{doc['_id']}", json=other)
    assert different.status_code == 409 and different.json()["code"] == upload.NOT_RENEWABLE
    assert different.json()["reason"] == (
        f"a different file for {doc['source_lfn']} is recorded (job retry 0, new): a job retry "
        "may replace a request that failed or was killed, not one on its way or copied"
    )
    second, fresh = sample_request("carol"), sample_request("carol")
    assert call(frontend, pki, carol, "POST", f"/{files_db}", json=second).status_code == 201
    changed = dict(second, size=second["size"] + 1)
    bulk = call(frontend, pki, carol, "POST", f"/{files_db}/_bulk_docs",
                json={"docs": [doc, changed, fresh]})  # fmt: skip
    assert bulk.status_code == 201, bulk.text
    rows = {row["id"]: row for row in bulk.json()}
    assert rows[doc["_id"]] == {"id": doc["_id"], **openapi_example("alreadyRecorded")}
    assert rows[second["_id"]]["reason"].startswith(upload.DIFFERENT_FILE)
    assert "rev" in rows[fresh["_id"]] and "error" not in rows[fresh["_id"]]
    # An update's conflict (a stale revision) is the store's own answer, unexplained.
    current = admin.db(files_db).get(doc["_id"])
    kill = model.transition(current, [Change(STATE, "killed", "carol")], model.OWNER)
    stale = dict(kill, _rev="1-" + "0" * 32)
    conflict = call(frontend, pki, carol, "PUT", f"/{files_db}/{doc['_id']}", json=stale)
    assert conflict.status_code == 409
    assert conflict.json()["reason"].startswith("Document update conflict")  # the store's words
    assert conflict.json()["code"] == openapi_example("staleRevision")["code"]


def openapi_example(name: str) -> dict[str, Any]:
    """A conflict's answer as docs/openapi.yaml gives it."""
    from aso.frontend import openapi

    return dict(openapi.CONFLICT["content"]["application/json"]["examples"][name]["value"])


def test_agents_and_operators_act_in_their_roles(frontend, pki, files_db, admin):
    carol, agent = cert_files(pki, "carol"), cert_files(pki, "agent-host")
    operator = cert_files(pki, "operator-x")
    doc = sample_request("carol")
    assert call(frontend, pki, carol, "POST", f"/{files_db}", json=doc).status_code == 201
    current = admin.db(files_db).get(doc["_id"])
    moved = model.transition(current, [Change(STATE, "submitted", "agent-host")], AGENT)
    # Alice cannot make the agents' transition; the agent can.
    assert (
        call(frontend, pki, carol, "PUT", f"/{files_db}/{doc['_id']}", json=moved).status_code
        == 403
    )
    answer = call(frontend, pki, agent, "PUT", f"/{files_db}/{doc['_id']}", json=moved)
    assert answer.status_code == 201, answer.text
    # An operator repairs any request (here: a priority no transition gives), but design
    # documents are the store admin's (`aso db init`), not anybody's through the front end.
    repaired = dict(admin.db(files_db).get(doc["_id"]), priority=7)
    answer = call(frontend, pki, operator, "PUT", f"/{files_db}/{doc['_id']}", json=repaired)
    assert answer.status_code == 201, answer.text
    assert admin.db(files_db).get(doc["_id"])["priority"] == 7
    design = {"_id": "_design/operator_test", "views": {}}
    answer = call(frontend, pki, operator, "PUT", f"/{files_db}/_design/operator_test", json=design)
    assert answer.status_code == 403, answer.text
    assert admin.db(files_db).get("_design/operator_test") is None


def test_a_service_account_of_the_store_is_not_given_out(
    frontend, pki, files_db, store_config: Config, accounts
):
    # The mapfile is read again when it changes: map a DN onto the agents' store account.
    mapfile = pki.root / "grid-mapfile"
    before = mapfile.read_text()
    intruder = pki.user("intruder")
    mapfile.write_text(before + f'"{intruder.dn}" {store_config.store.agent_user} aso-agent\n')
    try:
        answer = call(frontend, pki, cert_files(pki, "intruder"), "GET", f"/{files_db}")
        assert answer.status_code == 403 and "service account" in answer.json()["reason"]
        # Nor any store account the front end did not make (alice has one of her own).
        mapfile.write_text(before + f'"{intruder.dn}" alice\n')
        answer = call(frontend, pki, cert_files(pki, "intruder"), "GET", f"/{files_db}")
        assert answer.status_code == 403 and "not the front end's" in answer.json()["reason"]
        agent = Server(store_config.store.url, store_config.store.agent_user,
                       store_config.store.agent_password)  # fmt: skip
        assert agent.session()["name"] == store_config.store.agent_user  # password unchanged
    finally:
        mapfile.write_text(before)


# --- clients through the front end ----------------------------------------------------------
@pytest.fixture()
def client_config(frontend: str, store_config: Config, files_db: str, tmp_path: Path) -> Config:
    """What a user's or an agent host's config holds: the front end's URL and `auth = x509`,
    no store password; the credential comes from the grid variables."""
    store = dataclasses.replace(
        store_config.store, url=frontend, auth="x509", files_db=files_db, user="",
        password="", admin_password="", agent_password="",
    )  # fmt: skip
    config = dataclasses.replace(store_config, source=tmp_path / "client.toml", store=store)
    write_config(config)
    return config


def aso_with(config: Config, grid: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """`aso` with exactly these grid variables set (X509_CERT_DIR among them)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("X509_")}
    return subprocess.run([ASO, "--config", str(config.source), *args], env=env | grid,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_aso_hold_through_the_front_end_lists_and_releases_a_user_s_own_holds(
    client_config, pki, admin, files_db
):
    """Round 29: `aso hold list` read every hold with its document in one read of 10,000,
    which the front end refuses (a read with documents is a page of at most 1000): it failed
    for every client of the front end. It reads page by page; a user releases their own hold
    with it and cannot end another's."""
    from aso.config import HoldsConfig
    from aso.core import holds

    agents = admin.db(files_db)
    for user in ("carol", "dave"):
        doc = holds.started(None, site="T2_CH_CERN", user=user, error_class="quota",
                            reason="no space left", path=f"/store/user/{user}", needs=10,
                            by="agent", now=time.time(), config=HoldsConfig())  # fmt: skip
        assert doc is not None
        agents.put(doc)
    cadir = {"X509_CERT_DIR": str(pki.capath)}
    carol = cadir | {"X509_USER_PROXY": str(pki.proxy_file(pki.user("carol")))}
    listed = aso_with(client_config, carol, "hold", "list", "--site", "T2_CH_CERN")
    assert listed.returncode == 0, listed.stderr
    assert {line.split("\t")[1] for line in listed.stdout.splitlines()[1:]} == {"carol", "dave"}
    theirs = aso_with(client_config, carol, "hold", "release", "T2_CH_CERN", "--user", "dave")
    assert theirs.returncode == 1 and "may not change a hold of user" in theirs.stderr
    mine = aso_with(client_config, carol, "hold", "release", "T2_CH_CERN")
    assert mine.returncode == 0, mine.stderr
    assert agents.get(model.hold_id("T2_CH_CERN", "carol"))["state"] == model.HOLD_RELEASED
    assert agents.get(model.hold_id("T2_CH_CERN", "dave"))["state"] == model.HOLD_ACTIVE


def test_kill_and_resubmit_over_http_as_the_status_api_documents_them(frontend, pki, files_db):
    """docs/status-api.md, "Killing and resubmitting": the owner's GET and PUT, a move the
    rules do not allow refused with its rule, another user's kill refused."""
    carol, dave = cert_files(pki, "carol"), cert_files(pki, "dave")
    doc = sample_request("carol")
    path = f"/{files_db}/{doc['_id']}"
    assert call(frontend, pki, carol, "PUT", path, json=doc).status_code == 201

    def move(who: Any, to: str, reason: str) -> requests.Response:
        stored = call(frontend, pki, who, "GET", path).json()
        at = round(time.time(), 3)
        entry = {"axis": "state", "from": stored["state"], "to": to, "at": at,
                 "by": "carol", "reason": reason}  # fmt: skip
        changed = {**stored, "state": to, "last_update": at,
                   "history": [*stored["history"], entry]}  # fmt: skip
        return call(frontend, pki, who, "PUT", path, json=changed)

    assert move(dave, "killed", "not mine").status_code == 403
    killed = move(carol, "killed", "killed by the user")
    assert killed.status_code == 201, killed.text
    refused = move(carol, "done", "wishful")
    assert refused.status_code == 403 and refused.json()["reason"].startswith("[transition] ")
    assert refused.json()["code"] == "transition"  # the rule, for a client to act on
    again = move(carol, "new", "resubmitted by the user")
    assert again.status_code == 201, again.text
    assert call(frontend, pki, carol, "GET", path).json()["state"] == "new"


def test_a_user_reaches_only_their_own_subscription_to_notices(frontend, pki, store_config):
    """The notify database holds users' webhooks' secrets: a user reads and writes their own
    subscription (notify:<name>) and nothing else of it; another's id is refused by the gate
    (403), before the store is asked; the database's other reads are the services'."""
    carol = cert_files(pki, "carol")
    db = store_config.store.notify_db
    mine = f"/{db}/{model.subscription_id('carol')}"
    doc = {"type": model.SUBSCRIPTION_TYPE, "user": "carol", "events": ["held"],
           "targets": [{"kind": "webhook", "to": "https://hooks.example.org/hooks/s3cret"}],
           "updated": round(time.time(), 3), "by": "carol"}  # fmt: skip
    written = call(frontend, pki, carol, "PUT", mine, json=doc)
    assert written.status_code == 201, written.text
    read = call(frontend, pki, carol, "GET", mine)
    assert read.status_code == 200 and read.json()["targets"] == doc["targets"]
    theirs = f"/{db}/{model.subscription_id('dave')}"
    assert call(frontend, pki, carol, "GET", theirs).status_code == 403
    put = call(frontend, pki, carol, "PUT", theirs, json={**doc, "user": "dave", "by": "dave"})
    assert put.status_code == 403 and "only their own" in put.json()["reason"]
    refused = [("GET", f"/{db}/_all_docs?include_docs=true"), ("GET", f"/{db}/_changes"),
               ("GET", f"/{db}/{model.told_id('carol')}"), ("GET", f"/{db}"),
               ("POST", f"/{db}/_bulk_docs"), ("DELETE", mine)]  # fmt: skip
    for method, path in refused:
        answer = call(frontend, pki, carol, method, path, json={"docs": []})
        assert answer.status_code in (400, 403, 405), (method, path, answer.text)
    # In another's name under her own id: the store refuses it.
    forged = call(frontend, pki, carol, "PUT", mine,
                  json={**doc, "_rev": written.json()["rev"], "by": "dave"})  # fmt: skip
    assert forged.status_code == 403 and "recorded by its user" in forged.json()["reason"]


def test_aso_notify_through_the_front_end_takes_only_what_the_operator_allows(
    client_config, pki, admin, store_config
):
    """`aso notify add` checks a target against the allowlists the service publishes (the
    client's own config does not know them) and refuses one that would never be told; a user
    changes only their own subscription."""
    from aso.provision.designdocs import PAGES_DDOC, pages_design

    cadir = {"X509_CERT_DIR": str(pki.capath)}
    dave = cadir | {"X509_USER_PROXY": str(pki.proxy_file(pki.user("dave")))}
    never = aso_with(client_config, dave, "notify", "add", "--mail", "dave@example.org")
    assert never.returncode == 2 and "would never be told" in never.stderr, never.stderr
    pages = admin.db(store_config.store.pages_db)
    # The pages' settings of this module's database, with allowlists for the test's while.
    module = dataclasses.replace(store_config, store=dataclasses.replace(
        store_config.store, files_db=client_config.store.files_db))  # fmt: skip
    allowing = dataclasses.replace(module, notify=dataclasses.replace(
        store_config.notify, user_mail="mailto://127.0.0.1:1?from=aso@localhost",
        mail_domains=["example.org"], webhooks=["https://hooks.example.org/hooks/"]))  # fmt: skip
    store_admin.push_design(pages, pages_design(allowing))
    try:
        added = aso_with(client_config, dave, "notify", "add", "--mail", "dave@example.org",
                         "--event", "held", "--event", "task_done")  # fmt: skip
        assert added.returncode == 0, added.stderr
        elsewhere = aso_with(client_config, dave, "notify", "add", "--webhook",
                             "https://evil.example.net/hooks/x")  # fmt: skip
        assert elsewhere.returncode == 2 and "notify.webhooks" in elsewhere.stderr
        listed = aso_with(client_config, dave, "notify", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        shown = json.loads(listed.stdout)
        assert shown["events"] == ["held", "task_done"]
        assert shown["targets"] == [{"kind": "mail", "to": "dave@example.org", "told": True,
                                     "why_not": ""}]  # fmt: skip
        carol = cadir | {"X509_USER_PROXY": str(pki.proxy_file(pki.user("carol")))}
        theirs = aso_with(client_config, carol, "notify", "remove", "--all", "--user", "dave")
        assert theirs.returncode == 1 and "only their own" in theirs.stderr, theirs.stderr
        removed = aso_with(client_config, dave, "notify", "remove", "--mail", "dave@example.org")
        assert removed.returncode == 0 and "told at 0 address" in removed.stdout
    finally:
        store_admin.push_design(pages, pages_design(module))
    assert pages.get(PAGES_DDOC)["aso"]["notify"]["webhooks"] == []


def upload_args(user: str, task: str) -> list[str]:
    token = uuid.uuid4().hex[:8]
    path = f"/{user}/fe/{token}.root"
    return ["upload", "--task", task, "--job-id", "1", "--source", "T2_CH_CERN",
            "--destination", "T2_DE_DESY", "--source-lfn", f"/store/temp/user{path}",
            "--destination-lfn", f"/store/user{path}", "--size", "10",
            "--adler32", "0000000a", "--json"]  # fmt: skip


def test_aso_commands_go_through_the_front_end_with_the_grid_variables(
    client_config, pki, admin, files_db
):
    cadir = {"X509_CERT_DIR": str(pki.capath)}
    carol = cadir | {"X509_USER_PROXY": str(pki.proxy_file(pki.user("carol")))}
    dave_cert, dave_key = cert_files(pki, "dave")
    dave = cadir | {"X509_USER_CERT": dave_cert, "X509_USER_KEY": dave_key}
    task = f"261121_120000:carol_fe_{uuid.uuid4().hex[:6]}"
    db = admin.db(files_db)

    # Carol's proxy: the request is hers (the front end said who she is; no --user given).
    up = aso_with(client_config, carol, *upload_args("carol", task))
    assert up.returncode == 0, up.stderr
    [doc_id] = json.loads(up.stdout)["recorded"]
    assert db.get(doc_id)["user"] == "carol"

    # Dave's certificate and key: he cannot record in Carol's name, nor kill her task.
    forged = aso_with(client_config, dave, *upload_args("carol", task), "--user", "carol")
    assert forged.returncode == 1 and "forbidden" in forged.stdout + forged.stderr
    kill = aso_with(client_config, dave, "kill", "--task", task, "--json")
    assert kill.returncode == 1 and doc_id in json.loads(kill.stdout)["refused"]
    assert db.get(doc_id)["state"] == "new"

    # Carol kills her own task; the history says she did.
    kill = aso_with(client_config, carol, "kill", "--task", task, "--json")
    assert kill.returncode == 0, kill.stdout + kill.stderr
    stored = db.get(doc_id)
    assert stored["state"] == "killed" and stored["history"][-1]["by"] == "carol"

    # A credential named but missing, or none at all: one clear line, exit code 2.
    missing = aso_with(client_config, cadir | {"X509_USER_PROXY": "/nonexistent/x509up"},
                       "kill", "--task", task)  # fmt: skip
    assert missing.returncode == 2 and "cannot read /nonexistent/x509up" in missing.stderr
    no_ca = aso_with(client_config, carol | {"X509_CERT_DIR": "/nonexistent/ca"}, "kill",
                     "--task", task)  # fmt: skip
    assert no_ca.returncode == 2 and "CA directory /nonexistent/ca" in no_ca.stderr


def test_an_agent_works_through_the_front_end_with_its_host_certificate(
    client_config, pki, admin, files_db, monkeypatch
):
    """The retry manager, as an agent host runs it: the host certificate in X509_USER_CERT/KEY,
    its work set read from the `_changes` feed through the front end, its writes judged as the
    agent's."""
    from aso.agents.retry_manager import RetryManager
    from aso.runtime import Runner

    cert, key = cert_files(pki, "agent-host")
    monkeypatch.setenv("X509_USER_CERT", cert)
    monkeypatch.setenv("X509_USER_KEY", key)
    monkeypatch.setenv("X509_CERT_DIR", str(pki.capath))
    monkeypatch.delenv("X509_USER_PROXY", raising=False)
    db = admin.db(files_db)
    doc = sample_request("carol")
    doc["_rev"] = db.create(doc)
    for to in ("submitted", "failed_attempt"):
        doc = model.transition(doc, [Change(STATE, to, "t")], AGENT)
        doc["_rev"] = db.put(doc)
    agent = RetryManager(client_config, "fe-retry")
    assert agent.server.session()["name"] == "agent-host"
    runner = Runner(agent)
    runner.workset.start("feed")
    runner.step(wait=False)
    stored = db.get(doc["_id"])
    assert stored["state"] in ("retry", "failed") and stored["history"][-1]["by"] == "fe-retry"


@pytest.fixture()
def frontend_pid(frontend: str) -> int:
    return PIDS[frontend]


def store_connections(pid: int, port: int) -> set[int]:
    """Local ports of the established TCP connections of process `pid` to `port` (/proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if fields[3] == "01" and remote_port == port and fields[9] in inodes:
                found.add(local_port)
    return found


def test_a_long_poll_is_bounded_and_ends_with_its_client(
    frontend, frontend_pid, pki, admin, files_db, store_config
):
    """Users follow the `_changes` feed by long polls the front end bounds: a continuous feed is
    refused; a poll answers the change written while it waits; a quiet one ends at its timeout
    with no results on both stores (the embedded store never ends one itself), and its store
    connection ends with it; a client that leaves takes the store connection with it."""
    carol = cert_files(pki, "carol")
    db = admin.db(files_db)
    since = str(db.info()["update_seq"])
    store_port = int(store_config.store.url.rsplit(":", 1)[1])
    feed_url = f"{frontend}/{files_db}/_changes"
    get = functools.partial(requests.get, cert=carol, verify=str(pki.ca_file), timeout=30)
    continuous = get(feed_url, params={"feed": "continuous", "since": since})
    assert continuous.status_code == 400 and "longpoll" in continuous.json()["reason"]
    # Carol's store account is set up by her first request: before the count.
    assert get(f"{frontend}/_session").json()["userCtx"]["name"] == "carol"
    before = store_connections(frontend_pid, store_port)  # kept alive, for other requests
    doc = sample_request("carol")
    timer = threading.Timer(1.0, db.create, [doc])
    timer.start()
    polled = get(feed_url, params={"feed": "longpoll", "since": since, "timeout": 20000})
    timer.join()
    assert polled.status_code == 200
    assert [r["id"] for r in polled.json()["results"]] == [doc["_id"]]
    last = str(polled.json()["last_seq"])
    quiet = get(feed_url, params={"feed": "longpoll", "since": last, "timeout": 1000})
    assert quiet.status_code == 200 and quiet.json()["results"] == [], quiet.text
    assert str(quiet.json()["last_seq"]) in (last, str(db.info()["update_seq"]))
    wait_until(lambda: not store_connections(frontend_pid, store_port) - before, 15,
               "the front end kept an ended poll open to the store")  # fmt: skip
    # A client that leaves mid-poll (with heartbeats: bounded, from 1 s).
    feed = requests.get(feed_url, cert=carol, verify=str(pki.ca_file), stream=True, timeout=30,
                        params={"feed": "longpoll", "since": last, "heartbeat": 1000})  # fmt: skip
    try:
        assert feed.status_code == 200
        wait_until(lambda: store_connections(frontend_pid, store_port) - before, 15,
                   "no store connection for the poll")  # fmt: skip
    finally:
        feed.close()
    wait_until(lambda: not store_connections(frontend_pid, store_port) - before, 15,
               "the front end kept the feed open to the store")  # fmt: skip


def wait_until(condition: Any, seconds: float, message: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.2)


@only_on("couchdb", "proxy authentication is a CouchDB handler; the embedded store has none")
def test_proxy_mode_on_a_real_couchdb_acts_as_the_mapped_user(
    store_config, pki, files_db, admin, tmp_path
):
    """`frontend.auth = "proxy"` against a running CouchDB 3: no store account is made, CouchDB
    takes the signed X-Auth-CouchDB headers, and every write is judged as the mapped user's:
    carol records her request, dave cannot record one in carol's name."""
    secret = store_admin.node_config(admin)["chttpd_auth"]["secret"]
    config = frontend_config(store_config, pki, files_db, tmp_path)
    config = dataclasses.replace(
        config, frontend=dataclasses.replace(config.frontend, auth="proxy", secret=secret)
    )
    carol, dave = cert_files(pki, "carol"), cert_files(pki, "dave")
    doc = sample_request("carol")
    with frontend_process(config) as url:
        created = call(url, pki, carol, "POST", f"/{files_db}", json=doc)
        assert created.status_code == 201, created.text
        forged = call(url, pki, dave, "POST", f"/{files_db}", json=sample_request("carol"))
        assert forged.status_code == 403, forged.text
        assert forged.json()["reason"].startswith('[owner] user "dave" may not write requests')
        session = call(url, pki, dave, "GET", "/_session").json()
        assert session["userCtx"]["name"] == "dave"
        assert "aso-user" in session["userCtx"]["roles"]
    assert admin.db(files_db).get(doc["_id"])["history"][0]["by"] == "carol"


def test_proxy_mode_sends_couchdb_proxy_authentication():
    """The `proxy` identity (a real CouchDB): the three X-Auth-CouchDB headers, the token being
    what CouchDB computes, HMAC-SHA256 of the name with the shared secret, in hex (here
    computed by openssl)."""
    if not shutil.which("openssl"):
        pytest.skip("no openssl command to compute the token independently")
    headers = ProxyAuth("s3cret", "sha256").prepare(Mapped("alice", ("aso-user", "aso-agent")))
    expected = subprocess.run(
        ["openssl", "dgst", "-sha256", "-hmac", "s3cret"],
        input=b"alice", capture_output=True, check=True,
    ).stdout.split()[-1]  # fmt: skip
    assert headers == {
        b"x-auth-couchdb-username": b"alice",
        b"x-auth-couchdb-roles": b"aso-user,aso-agent",
        b"x-auth-couchdb-token": expected,
    }
    with pytest.raises(ValueError, match="secret"):
        ProxyAuth("", "sha256")


def frontend_counts(frontend: str) -> Counter[tuple[str, ...]]:
    """The front end's request and refusal counters, from its /metrics."""
    text = requests.get(f"http://{METRICS[frontend]}/metrics", timeout=10).text
    counts: Counter[tuple[str, ...]] = Counter()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "aso_frontend_requests_total":
                counts[("requests", s.labels["method"], s.labels["code"])] += s.value
            elif s.name == "aso_frontend_refusals_total":
                counts[("refused", s.labels["reason"])] += s.value
    return counts


def test_metrics_count_answers_and_refusals(frontend, pki, files_db):
    before = frontend_counts(frontend)
    doc = sample_request("carol")
    good = call(frontend, pki, cert_files(pki, "carol"), "POST", f"/{files_db}", json=doc)
    assert good.status_code == 201, good.text
    refused = call(frontend, pki, None, "GET", f"/{files_db}/{doc['_id']}")
    assert refused.status_code == 401
    unmapped = call(frontend, pki, credentials(pki, "unknown DN"), "GET", f"/{files_db}")
    assert unmapped.status_code == 403
    after = frontend_counts(frontend)
    change = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    assert change == {
        ("requests", "POST", "201"): 1,
        ("requests", "GET", "401"): 1,
        ("requests", "GET", "403"): 1,
        ("refused", "certificate"): 1,
        ("refused", "unmapped"): 1,
    }


def test_a_taken_metrics_port_turns_the_metrics_off_not_the_front_end(
    store_config, pki, files_db, tmp_path
):
    """Another process holds metrics.frontend_port: the front end still serves its users and
    says in its log that its metrics are off and why."""
    config = frontend_config(store_config, pki, files_db, tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", config.metrics.frontend_port))
        taken.listen()
        with frontend_process(config) as url:
            answer = call(url, pki, cert_files(pki, "carol"), "GET", f"/{files_db}")
            assert answer.status_code == 200, answer.text
    log = (tmp_path / "frontend.log").read_text()
    assert f"metrics off: cannot listen on 127.0.0.1:{config.metrics.frontend_port}" in log


def test_the_mapfile_grants_group_areas_and_refuses_names_that_would_share_an_area():
    """Group areas are granted only here (role group:<group>); a user name with a dot would own
    another user's /store/temp/user/<name>.<hash>/ and is refused."""
    parsed = GridMap.parse('"/DC=org/CN=carol" carol aso-user,group:higgs\n')
    assert parsed["/DC=org/CN=carol"].roles == (model.USER_ROLE, "group:higgs")
    for line, words in (
        ('"/DC=org/CN=a" alice.x', "'alice.x' is not a user name"),
        ('"/DC=org/CN=a" _admin', "'_admin' is not a user name"),
        ('"/DC=org/CN=a" alice_x', "'alice_x' is not a user name"),
        ('"/DC=org/CN=a" alice aso-user,group:', "unknown role 'group:'"),
        ('"/DC=org/CN=a" alice group:../x', "unknown role 'group:../x'"),
    ):
        with pytest.raises(MapfileError, match=re.escape(words)):
            GridMap.parse(line)
    # A group named as a user: the group's members would publish into the user's datasets.
    two = '"/DC=org/CN=a" alice\n"/DC=org/CN=c" carol aso-user,group:alice\n'
    with pytest.raises(MapfileError, match="group 'alice' of carol has the name of a user"):
        GridMap.parse(two)


# --- in process: the front end on a reactor of this test session ---------------------------
@pytest.fixture(scope="module")
def running_reactor() -> Iterator[Any]:
    """Twisted's reactor, run in a thread of the test process (it cannot be started twice in
    one process: one for the module, stopped at its end)."""
    from twisted.internet import reactor

    thread = threading.Thread(
        target=reactor.run, kwargs={"installSignalHandlers": False}, daemon=True
    )
    thread.start()
    yield reactor
    reactor.callFromThread(reactor.stop)
    thread.join(30)


@contextmanager
def frontend_in_process(reactor: Any, config: Config) -> Iterator[str]:
    """The front end of `config` served by `reactor` (aso.frontend.build takes the reactor),
    its connections admitted as `aso frontend` admits them."""
    from twisted.internet.threads import blockingCallFromThread

    root, tls = frontend_module.build(config, reactor)
    site = frontend_module._Site(root, config.frontend)
    admission = frontend_module._Admission(tls, site, config.frontend, reactor)
    host, _, port = config.frontend.listen.rpartition(":")
    listening = blockingCallFromThread(
        reactor, reactor.listenTCP, int(port), admission, interface=host
    )
    try:
        yield f"https://{config.frontend.listen}"
    finally:
        blockingCallFromThread(reactor, listening.stopListening)


def daves_check_held(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """dave's certificate checks wait until the event returned is set (a CRL being read,
    say); others' go on."""
    release = threading.Event()
    verify = frontend_module.verify_chain

    def held_for_dave(chain: Any, trust: Any, **kw: Any) -> Any:
        identity = verify(chain, trust, **kw)
        if identity.dn.endswith("CN=dave"):
            assert release.wait(120), "dave's check was never released"
        return identity

    monkeypatch.setattr(frontend_module, "verify_chain", held_for_dave)
    return release


def test_a_slow_certificate_check_holds_up_no_other_client(
    running_reactor, store_config, pki, files_db, tmp_path, monkeypatch
):
    """Certificate and CRL checks run off the reactor thread (issue 19): while dave's check is
    held (a CRL being read, say), carol's request is answered; on the reactor thread, carol's
    request would wait for dave's check, which this test releases only after carol's answer."""
    release = daves_check_held(monkeypatch)
    config = frontend_config(store_config, pki, files_db, tmp_path)
    dave, carol = cert_files(pki, "dave"), cert_files(pki, "carol")
    with frontend_in_process(running_reactor, config) as url, ThreadPoolExecutor(1) as pool:
        daves = pool.submit(call, url, pki, dave, "GET", f"/{files_db}")
        try:
            answer = call(url, pki, carol, "GET", f"/{files_db}")
            assert answer.status_code == 200, answer.text
            assert not daves.done()
        finally:
            release.set()
        assert daves.result(60).status_code == 200


def test_a_body_whole_before_its_chain_verifies_is_its_user_s(
    running_reactor, store_config, pki, files_db, tmp_path, monkeypatch
):
    """Bodies are charged to their client's address until its chain verifies, then to its
    user. A body that came whole before the verdict had stayed its address's: dave, from two
    addresses, held twice his room. Now the verdict moves it to him, and the body past his
    room gets 503 with Retry-After (the other is judged: spaces are no JSON)."""
    release = daves_check_held(monkeypatch)
    # Each body's check waits too, so that the first body verified still holds its bytes when
    # the second's verdict comes (spaces are judged at once: under load the first had been
    # answered, its bytes given back, before the second was verified).
    checked = threading.Event()
    check = frontend_module.BodyChecks.check

    def held_check(self: Any, *args: Any) -> Any:
        assert checked.wait(120), "the checks were never released"
        return check(self, *args)

    monkeypatch.setattr(frontend_module.BodyChecks, "check", held_check)
    config = frontend_config(store_config, pki, files_db, tmp_path)
    mib = 1 << 20
    config.frontend = dataclasses.replace(config.frontend, max_body=mib, body_processes=0,
                                          body_bytes_per_user=mib + mib // 2)  # fmt: skip
    length = mib - 1024
    head = (f"POST /{files_db}/_bulk_docs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n")  # fmt: skip
    context = client_context(pki.ca_file, *cert_files(pki, "dave"))
    with frontend_in_process(running_reactor, config) as url:
        connections = [connect(url, context, source, timeout=60)
                       for source in ("127.0.0.1", "127.0.0.2")]  # fmt: skip
        try:
            for each in connections:
                each.sendall(head.encode() + b" " * length)
            time.sleep(1)  # both bodies whole at the front end, dave's chain still checked
            release.set()
            time.sleep(1)  # both verified: one body judged (held), the other past his room
            checked.set()
            answers = [read_to_end(each) for each in connections]
        finally:
            release.set()
            checked.set()
            for each in connections:
                each.close()
    statuses = sorted(int(answer.split(b" ", 2)[1]) for answer in answers)
    assert statuses == [400, 503], [answer[:200] for answer in answers]
    busy = next(answer for answer in answers if answer.startswith(b"HTTP/1.1 503 "))
    assert b"\r\nretry-after: 5\r\n" in busy.lower() and b"try again later" in busy, busy


def test_one_user_s_writes_go_to_the_store_two_at_a_time(
    running_reactor, store_config, pki, files_db, tmp_path, monkeypatch
):
    """The store validates every document of a write in JavaScript: a user's bulk writes of
    documents it refused one by one had kept it busy for every other user (red team round
    12). A user's writes go to the store WRITES_PER_USER at a time, the rest in that user's
    turn; another user's write goes meanwhile."""
    sent: list[tuple[str, Any]] = []

    def held(self: Any, request: Any, who: Mapped, *_: Any, **__: Any) -> None:
        sent.append((who.name, request))

    monkeypatch.setattr(frontend_module.FrontEnd, "_send", held)
    config = frontend_config(store_config, pki, files_db, tmp_path)
    dave, carol = cert_files(pki, "dave"), cert_files(pki, "carol")

    def write(who: str, cert: Any) -> int:
        doc = sample_request(who)
        return call(url, pki, cert, "PUT", f"/{files_db}/{doc['_id']}", json=doc).status_code

    with frontend_in_process(running_reactor, config) as url, ThreadPoolExecutor(5) as pool:
        daves = [pool.submit(write, "dave", dave) for _ in range(4)]
        wait_until(lambda: len(sent) >= frontend_module.WRITES_PER_USER, 30, "dave's first writes")
        time.sleep(0.5)  # dave's others wait their turn
        assert [who for who, _ in sent] == ["dave"] * frontend_module.WRITES_PER_USER
        carols = pool.submit(write, "carol", carol)
        wait_until(lambda: any(who == "carol" for who, _ in sent), 30, "carol's write sent")
        for _, request in list(sent):  # the store's answers: dave's next ones go
            running_reactor.callFromThread(finish_with, request, 201)
        wait_until(lambda: len(sent) == 5, 30, "dave's other writes sent in their turn")
        for _, request in sent[3:]:
            running_reactor.callFromThread(finish_with, request, 201)
        assert sorted(f.result(30) for f in [*daves, carols]) == [201] * 5


def test_a_user_s_documents_are_paced_a_burst_at_once_then_at_the_rate():
    """Pace: a write goes at once while the user's allowance holds its documents (at most the
    burst), then the user's next writes wait for the allowance to refill at the rate; another
    user's allowance is their own."""
    from twisted.internet.task import Clock

    clock = Clock()
    pace = frontend_module.Pace(clock, rate=100, burst=1000)
    assert pace.delay("dave", 1000) == 0  # the burst goes at once
    assert pace.delay("carol", 1000) == 0  # carol's allowance is her own
    assert pace.delay("dave", 500) == pytest.approx(5.0)  # 500 more: 5 s at 100 a second
    assert pace.delay("dave", 1) == pytest.approx(5.01)  # behind the 500 already granted
    clock.advance(30)  # 2,499 documents' worth: the allowance is full (the burst) again
    assert pace.delay("dave", 1000) == 0
    assert pace.delay("dave", 1000) == pytest.approx(10.0)  # nothing kept beyond the burst


def writes_answered_201(
    running_reactor: Any,
    store_config: Config,
    pki: Pki,
    files_db: str,
    base: Path,
    monkeypatch: Any,
) -> tuple[list[tuple[str, Any]], Config]:
    """A front end's config at 200 documents a user a second, and the (user, request) of each
    request it sends to the store, answered 201 there and then (no store behind it)."""
    sent: list[tuple[str, Any]] = []

    def held(self: Any, request: Any, who: Mapped, *_: Any, **__: Any) -> None:
        sent.append((who.name, request))
        running_reactor.callLater(0, finish_with, request, 201)

    monkeypatch.setattr(frontend_module.FrontEnd, "_send", held)
    config = frontend_config(store_config, pki, files_db, base)
    config.frontend = dataclasses.replace(config.frontend, user_docs_per_second=200)
    return sent, config


def test_one_user_s_bulk_writes_are_paced_while_another_s_write_goes(
    running_reactor, store_config, pki, files_db, tmp_path, monkeypatch
):
    """A user's 1,000-document bulk writes, two at a time, had slowed bob's reads 60 times on
    the embedded store (red team round 13): past a burst of 1,000, a user's documents go to the
    store at frontend.user_docs_per_second; another user's write goes meanwhile."""
    sent, config = writes_answered_201(
        running_reactor, store_config, pki, files_db, tmp_path, monkeypatch
    )
    dave, carol = cert_files(pki, "dave"), cert_files(pki, "carol")
    bulk = {"docs": [sample_request("dave") for _ in range(1000)]}

    def write(who: str, cert: Any) -> int:
        if who == "dave":
            return call(url, pki, cert, "POST", f"/{files_db}/_bulk_docs", json=bulk).status_code
        doc = sample_request(who)
        return call(url, pki, cert, "PUT", f"/{files_db}/{doc['_id']}", json=doc).status_code

    with frontend_in_process(running_reactor, config) as url, ThreadPoolExecutor(3) as pool:
        assert write("dave", dave) == 201  # the burst: at once
        daves = pool.submit(write, "dave", dave)  # 1,000 more: 5 s later
        time.sleep(0.5)
        carols = pool.submit(write, "carol", carol)
        wait_until(lambda: any(who == "carol" for who, _ in sent), 30, "carol's write sent")
        assert [who for who, _ in sent] == ["dave", "carol"]  # dave's second still waits
        assert carols.result(30) == 201
        assert daves.result(60) == 201
    assert [who for who, _ in sent] == ["dave", "carol", "dave"]


def test_a_user_s_large_documents_are_paced_by_their_bytes(
    running_reactor, store_config, pki, files_db, tmp_path, monkeypatch
):
    """Red team round 22: 3,000 requests of 69 KB at the document pace had grown the store by
    153 MB in 38 s and slowed bob's reads six times. A write counts one document per
    limits.PACED_DOC_BYTES of its body: 150 large requests spend more than a burst, and the
    user's next write waits, where 150 small ones would have left it free to go."""
    sent, config = writes_answered_201(
        running_reactor, store_config, pki, files_db, tmp_path, monkeypatch
    )
    dave = cert_files(pki, "dave")
    parents = [f"/store/mc/{'x' * 470}/{n:03d}.root" for n in range(100)]  # 49 KB a request
    info = {"dataset": "/Prim/dave-proc/USER", "parents": parents}

    def write(docs: list[dict[str, Any]]) -> int:
        bulk = {"docs": docs}
        return call(url, pki, dave, "POST", f"/{files_db}/_bulk_docs", json=bulk).status_code

    large = [sample_request("dave", publish=True, publish_info=info) for _ in range(150)]
    body = len(json.dumps({"docs": large}))
    assert body > (limits.MAX_DOCS + 400) * limits.PACED_DOC_BYTES, body
    with frontend_in_process(running_reactor, config) as url, ThreadPoolExecutor(1) as pool:
        assert write(large) == 201  # the burst goes at once, and more is owed
        small = pool.submit(write, [sample_request("dave")])
        time.sleep(1.0)
        assert len(sent) == 1  # the small write waits for the bytes owed (~3.5 s at 200 a second)
        assert small.result(30) == 201
    assert len(sent) == 2


def test_a_user_s_light_reads_go_to_the_store_a_few_at_once(
    running_reactor, store_config, pki, files_db, tmp_path, monkeypatch
):
    """Red team round 21: the embedded store runs one view's reads one after another, and 64
    of alice's pages at once had queued bob's reads of that view 3-10 s. A user's light reads
    go to the store READS_PER_USER at once, the rest waiting their turn; another user's read
    goes meanwhile; the operator's are not counted."""
    sent: list[tuple[str, Any]] = []

    def held(self: Any, request: Any, who: Mapped, *_: Any, **__: Any) -> None:
        sent.append((who.name, request))  # answered by the test, when it says

    monkeypatch.setattr(frontend_module.FrontEnd, "_send", held)
    config = frontend_config(store_config, pki, files_db, tmp_path)
    dave, carol = cert_files(pki, "dave"), cert_files(pki, "carol")
    page = f"/{files_db}/_design/asyncstageout/_view/by_task?limit=10"
    many = frontend_module.READS_PER_USER + 4

    def read(cert: Any) -> int:
        return call(url, pki, cert, "GET", page).status_code

    def of(name: str) -> list[Any]:
        return [request for who, request in sent if who == name]

    with frontend_in_process(running_reactor, config) as url, ThreadPoolExecutor(many + 1) as pool:
        daves = [pool.submit(read, dave) for _ in range(many)]
        wait_until(lambda: len(of("dave")) == frontend_module.READS_PER_USER, 30, "dave's first")
        carols = pool.submit(read, carol)
        wait_until(lambda: len(of("carol")) == 1, 30, "carol's read sent")
        time.sleep(0.5)
        assert len(of("dave")) == frontend_module.READS_PER_USER  # the rest wait their turn
        for request in of("dave") + of("carol"):
            running_reactor.callFromThread(finish_with, request, 200)
        wait_until(lambda: len(of("dave")) == many, 30, "dave's others sent as turns came back")
        for request in of("dave")[frontend_module.READS_PER_USER :]:
            running_reactor.callFromThread(finish_with, request, 200)
        assert carols.result(30) == 200
        assert [f.result(30) for f in daves] == [200] * many


def test_a_user_s_heavy_reads_have_a_share_of_the_store_s_time(
    running_reactor, store_config, pki, files_db, tmp_path, monkeypatch
):
    """Red team round 22: one of alice's grouped reads of a whole view at a time, 8-14 s each
    on the embedded store, had held that view for everyone (bob's reads of it p50 13 s). A
    user's heavy reads hold the store at most HEAVY_SHARE of the time: the time each took is
    spent from the user's allowance, and a heavy read that would wait past HEAVY_WAIT for it is
    refused 503 with when to come back. Her light reads and another user's heavy read go."""
    monkeypatch.setattr(frontend_module, "HEAVY_BURST", 0.0)  # no read free of its cost
    monkeypatch.setattr(frontend_module, "HEAVY_SHARE", 0.0001)
    monkeypatch.setattr(frontend_module, "HEAVY_WAIT", 0.001)
    config = frontend_config(store_config, pki, files_db, tmp_path)
    dave, carol = cert_files(pki, "dave"), cert_files(pki, "carol")
    grouped = f"/{files_db}/_design/asyncstageout/_view/by_state?group=true"
    page = f"/{files_db}/_design/asyncstageout/_view/by_state?reduce=false&limit=10"
    with frontend_in_process(running_reactor, config) as url:
        assert call(url, pki, dave, "GET", grouped).status_code == 200  # its time spent after
        refused = call(url, pki, dave, "GET", grouped)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"] == "too_costly"
        assert "held the store" in refused.json()["reason"]
        assert int(refused.headers["retry-after"]) >= 1
        assert call(url, pki, dave, "GET", page).status_code == 200
        assert call(url, pki, carol, "GET", grouped).status_code == 200


def test_a_user_s_heavy_read_is_charged_its_whole_time_whatever_else_ends_meanwhile():
    """Red team round 26: a heavy read was charged from the end of the last heavy read anyone
    had, so other clients' heavy reads ending while alice's whole-view reads ran cut her charge
    to nothing (her reads then held the view 100 % of the time, bob's p50 0.03 -> 8.3 s). Each
    is charged from its sending to its answer."""
    charged: list[tuple[str, float]] = []
    front = types.SimpleNamespace(heavy_time=types.SimpleNamespace(
        delay=lambda user, seconds: charged.append((user, seconds))))  # fmt: skip
    started = time.monotonic() - 5.0
    for _ in range(3):  # others' heavy reads, answered while hers runs
        frontend_module.FrontEnd._heavy_done(front, "carol", time.monotonic() - 0.01)
        frontend_module.FrontEnd._heavy_done(front, None, time.monotonic() - 0.01)
    frontend_module.FrontEnd._heavy_done(front, "alice", started)
    [seconds] = [spent for who, spent in charged if who == "alice"]
    assert seconds >= 5.0


def test_a_filtered_long_poll_catches_up_in_its_user_s_heavy_turn(
    running_reactor, store_config, pki, files_db, tmp_path, monkeypatch
):
    """A filtered long poll from behind the store's sequence is first asked as a batch, which
    costs what a filtered batch costs: it takes a heavy read's turn, as the batch does (polls
    with a short timeout had been batches without one). From the store's sequence on, it is a
    poll again (its own turn: frontend.polls_per_user)."""
    turns: list[tuple[str, str]] = []
    real = frontend_module.Slots.take_for

    def recorded(self: Any, request: Any, name: str, *args: Any, **kw: Any) -> Any:
        turns.append((self.what, name))
        return real(self, request, name, *args, **kw)

    monkeypatch.setattr(frontend_module.Slots, "take_for", recorded)
    config = frontend_config(store_config, pki, files_db, tmp_path)
    dave = cert_files(pki, "dave")
    doc = sample_request("dave")
    feed = f"/{files_db}/_changes?filter=_doc_ids&feed=longpoll&timeout=1000&since="
    with frontend_in_process(running_reactor, config) as url:
        assert call(url, pki, dave, "PUT", f"/{files_db}/{doc['_id']}", json=doc).status_code == 201
        turns.clear()
        answer = call(url, pki, dave, "POST", feed + "0", json={"doc_ids": [doc["_id"]]})
        assert answer.status_code == 200 and [c["id"] for c in answer.json()["results"]] == [
            doc["_id"]
        ]
        heavy = [who for what, who in turns if what.startswith("heavy reads")]
        polls = [who for what, who in turns if what == "long polls"]
        assert polls == ["dave"]
        if frontend_module.sequences.is_number(str(answer.json()["last_seq"])):
            assert heavy == ["dave"]  # the embedded store: caught up as a batch first
        else:
            assert heavy == []  # CouchDB's feed moves on by itself: a poll as asked


def test_a_filtered_long_poll_whose_client_left_early_holds_no_turn(
    running_reactor, store_config, pki, files_db, tmp_path, monkeypatch
):
    """Red team round 15: a client that left a filtered long poll while the front end read the
    store's sequence made its heavy read's turn be taken after the request had ended, and never
    given back (its user's heavy reads were 503 until a restart; two users' took every shared
    slot). A turn asked for a request that has ended is not given, and the catch-up of a poll
    whose client left is not made."""
    from twisted.internet import task

    real = frontend_module.FrontEnd._update_seq

    def slow(self: Any, made: Any, headers: Any) -> Any:  # the client leaves meanwhile
        return task.deferLater(running_reactor, 0.5, real, self, made, headers)

    monkeypatch.setattr(frontend_module.FrontEnd, "_update_seq", slow)
    config = frontend_config(store_config, pki, files_db, tmp_path)
    dave = cert_files(pki, "dave")
    doc = sample_request("dave")
    body = json.dumps({"doc_ids": ["0" * 64]}).encode()
    head = (f"POST /{files_db}/_changes?filter=_doc_ids&feed=longpoll&timeout=60000&since=0 "
            f"HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
    context = client_context(pki.ca_file, *dave)
    with frontend_in_process(running_reactor, config) as url:
        assert call(url, pki, dave, "PUT", f"/{files_db}/{doc['_id']}", json=doc).status_code == 201
        for _ in range(2):  # dave's own turn, then one of the shared ones
            left = connect(url, context)
            left.sendall(head + body)
            time.sleep(0.1)
            left.close()
        time.sleep(1)  # the sequences read, after the clients left
        docs = f"/{files_db}/_all_docs?include_docs=true&limit=1&endkey=%22_%22&inclusive_end=false"
        read = call(url, pki, dave, "GET", docs)
        assert read.status_code == 200, read.text[:300]


@only_on("pouchdb", "the catch-up handles EMBEDDED_FILTERED_LAST_SEQ; CouchDB's feed moves on")
def test_a_filtered_long_poll_s_catch_up_ends_within_the_poll_s_time(
    running_reactor, store_config, pki, files_db, tmp_path, monkeypatch
):
    """Red team round 15: the batch a filtered long poll catches up with had no time bound, so
    a busy store made a poll of 1 ms last a whole history's scan. A catch-up the store does not
    answer within the poll's time ends the poll quiet, from where it was asked."""
    from twisted.internet import defer
    from twisted.web.client import Agent

    real = Agent.request

    def store_never_answers_a_batch(self: Any, method: bytes, uri: bytes, *rest: Any) -> Any:
        if b"_changes" in uri and b"feed=normal" in uri:
            return defer.Deferred()  # cancelled at the poll's time
        return real(self, method, uri, *rest)

    monkeypatch.setattr(Agent, "request", store_never_answers_a_batch)
    config = frontend_config(store_config, pki, files_db, tmp_path)
    dave = cert_files(pki, "dave")
    doc = sample_request("dave")
    feed = f"/{files_db}/_changes?filter=_doc_ids&feed=longpoll&timeout=1000&since=0"
    with frontend_in_process(running_reactor, config) as url:
        assert call(url, pki, dave, "PUT", f"/{files_db}/{doc['_id']}", json=doc).status_code == 201
        answer = call(url, pki, dave, "POST", feed, json={"doc_ids": [doc["_id"]]})
        assert answer.status_code == 200, answer.text[:300]
        assert answer.json()["results"] == [] and str(answer.json()["last_seq"]) == "0"


def test_a_filtered_long_poll_with_documents_gives_its_turn_back_and_its_change(
    running_reactor, store_config, pki, files_db, tmp_path
):
    """Red team round 16: a user's filtered long poll with include_docs took its user's heavy
    queue in forward, then its catch-up waited for that same queue: the poll ended quiet
    without the change it asked for, and the turn was never given back (the user's heavy reads
    were 503 until a restart). Its turns are its catch-up's, each given back."""
    config = frontend_config(store_config, pki, files_db, tmp_path)
    dave = cert_files(pki, "dave")
    doc = sample_request("dave")
    feed = f"/{files_db}/_changes?filter=_doc_ids&feed=longpoll&timeout=3000&include_docs=true"
    heavy = f"/{files_db}/_all_docs?include_docs=true&limit=1&endkey=%22_%22&inclusive_end=false"
    with frontend_in_process(running_reactor, config) as url:
        assert call(url, pki, dave, "PUT", f"/{files_db}/{doc['_id']}", json=doc).status_code == 201
        answer = call(url, pki, dave, "POST", feed + "&since=0", json={"doc_ids": [doc["_id"]]})
        assert answer.status_code == 200, answer.text[:300]
        [change] = answer.json()["results"]
        assert change["id"] == doc["_id"] and change["doc"]["source_lfn"] == doc["source_lfn"]
        read = call(url, pki, dave, "GET", heavy)
        assert read.status_code == 200, read.text[:300]
        last = answer.json()["last_seq"]
        quiet = call(url, pki, dave, "POST", f"{feed}&since={last}", json={"doc_ids": [doc["_id"]]})
        assert quiet.status_code == 200 and quiet.json()["results"] == [], quiet.text[:300]
        read = call(url, pki, dave, "GET", heavy)
        assert read.status_code == 200, read.text[:300]


HEAVY_READ = "_all_docs?include_docs=true&limit=1&endkey=%22_%22&inclusive_end=false"


def _never_read(monkeypatch: Any) -> list[Any]:
    """Answers read whole from the store never go out (as to a client that reads nothing):
    their requests stay open; the list holds them."""
    kept: list[Any] = []
    monkeypatch.setattr(frontend_module, "_send_whole", lambda request, *_: kept.append(request))
    return kept


def _raw_post(url: str, context: Any, path: str, body: bytes) -> Any:
    sock = connect(url, context)
    sock.sendall((f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n").encode() + body)  # fmt: skip
    return sock


@only_on("pouchdb", "the catch-up handles EMBEDDED_FILTERED_LAST_SEQ; CouchDB's feed moves on")
def test_a_catch_up_that_found_changes_gives_its_turn_back_once_read_from_the_store(
    running_reactor, store_config, pki, files_db, tmp_path, monkeypatch
):
    """Red team round 17: a filtered long poll whose catch-up found changes held its heavy
    turn until its client had read the answer, so a client that read nothing held it for good
    (two users' held every shared slot: everyone's heavy reads were 503 for six minutes). The
    turn is the store's work: it goes back once the batch is read whole from the store."""
    kept = _never_read(monkeypatch)
    config = frontend_config(store_config, pki, files_db, tmp_path)
    dave = cert_files(pki, "dave")
    doc = sample_request("dave")
    poll = f"/{files_db}/_changes?filter=_doc_ids&feed=longpoll&timeout=60000&since=0"
    with frontend_in_process(running_reactor, config) as url:
        assert call(url, pki, dave, "PUT", f"/{files_db}/{doc['_id']}", json=doc).status_code == 201
        sock = _raw_post(url, client_context(pki.ca_file, *dave), poll,
                         json.dumps({"doc_ids": [doc["_id"]]}).encode())  # fmt: skip
        try:
            wait_until(lambda: kept, 30, "the catch-up's answer read from the store")
            read = call(url, pki, dave, "GET", f"/{files_db}/{HEAVY_READ}")
            assert read.status_code == 200, read.text[:300]
        finally:
            sock.close()


def test_a_changes_batch_without_a_limit_is_one_page(frontend, pki, files_db, admin):
    """A `_changes` batch that names no limit answers a page of at most 1000 changes, the next
    from its last_seq (a user's had answered a whole feed of 24,211 changes in one read)."""
    docs = [sample_request("carol", task="261207_130000:carol_many") for _ in range(1100)]
    assert all(r.ok for r in admin.db(files_db).bulk_write(docs))
    carol = cert_files(pki, "carol")
    seen: set[str] = set()
    since: Any = 0
    pages = 0
    while True:
        answer = call(frontend, pki, carol, "GET", f"/{files_db}/_changes?since={since}")
        assert answer.status_code == 200, answer.text[:300]
        results = answer.json()["results"]
        assert len(results) <= 1000
        if not results:
            break
        seen.update(r["id"] for r in results)
        since, pages = answer.json()["last_seq"], pages + 1
    assert pages >= 2 and {d["_id"] for d in docs} <= seen


def test_unread_changes_batches_do_not_hold_the_shared_heavy_slots(
    running_reactor, store_config, pki, files_db, tmp_path, monkeypatch
):
    """A filtered `_changes` batch is a heavy read: once the store's answer is read whole its
    shared slot goes back, its user's own queue being held until the client has read it (two
    users' unread answers had held both shared slots: every other user's heavy reads 503)."""
    kept = _never_read(monkeypatch)
    config = frontend_config(store_config, pki, files_db, tmp_path)
    users = ["dave", "carol", "erin"][: frontend_module.HEAVY_READS + 1]
    certs = {who: cert_files(pki, who) for who in users}
    batch = f"/{files_db}/_changes?filter=_doc_ids&since=0"
    with frontend_in_process(running_reactor, config) as url:
        socks = [_raw_post(url, client_context(pki.ca_file, *certs[who]), batch,
                           json.dumps({"doc_ids": ["0" * 64]}).encode())
                 for who in users[:-1]]  # fmt: skip
        try:
            wait_until(lambda: len(kept) == len(socks), 30, "the batches read from the store")
            last = users[-1]
            read = call(url, pki, certs[last], "GET", f"/{files_db}/{HEAVY_READ}")
            assert read.status_code == 200, read.text[:300]
            again = requests.get(url + f"/{files_db}/{HEAVY_READ}", cert=certs[users[0]],
                                 verify=str(pki.ca_file), timeout=60)  # fmt: skip
            assert again.status_code == 503, again.text[:300]  # its own queue: held
        finally:
            for sock in socks:
                sock.close()


def test_an_answer_read_whole_is_cut_if_its_client_does_not_read_it(monkeypatch):
    """_send_whole: an answer its client does not read is cut after HEAVY_HOLD (a poll slot
    and the answer's memory are held until the request ends); one that is read is not."""
    from types import SimpleNamespace

    from twisted.internet.task import Clock
    from twisted.web.http_headers import Headers
    from twisted.web.test.requesthelper import DummyRequest

    class Unread(DummyRequest):
        def registerProducer(self, producer: Any, streaming: bool) -> None:
            self.producer = producer  # the client takes nothing

    cut: list[Any] = []
    monkeypatch.setattr(frontend_module, "_cut", cut.append)
    response = SimpleNamespace(code=200, phrase=b"OK", headers=Headers({}))
    clock = Clock()
    unread, read = Unread([b""]), Unread([b""])
    for request in (unread, read):
        frontend_module._send_whole(request, response, b"{}", clock)
    read.finish()
    clock.advance(frontend_module.HEAVY_HOLD - 1)
    assert cut == []
    clock.advance(1)
    assert cut == [unread]


def test_a_quiet_long_poll_with_documents_ends_quiet_at_its_time_not_cut(
    running_reactor, store_config, pki, files_db, tmp_path, monkeypatch
):
    """Red team round 17: a long poll with documents of the longest timeout (60 s) was cut at
    HEAVY_HOLD (60 s), before its own end, with no answer: the hold on a client that does not
    read begins once a poll's own time is over."""
    monkeypatch.setattr(frontend_module, "HEAVY_HOLD", 1.0)
    config = frontend_config(store_config, pki, files_db, tmp_path)
    dave = cert_files(pki, "dave")
    poll = f"/{files_db}/_changes?feed=longpoll&include_docs=true&timeout=2000&since=now"
    with frontend_in_process(running_reactor, config) as url:
        answer = call(url, pki, dave, "GET", poll)
        assert answer.status_code == 200, answer.text[:300]
        assert answer.json()["results"] == []


def test_a_user_s_long_polls_with_documents_are_paced_by_their_bytes(
    running_reactor, store_config, pki, files_db, tmp_path, admin, monkeypatch
):
    """Red team round 24: a long poll with documents from an old `since` answers at once, as a
    batch would, but was never charged to its user's heavy share: four of alice's kept the
    embedded store 85 % busy (82 answers, 2.8 GB in 30 s). Its answer's bytes are spent from
    the share (DOC_BYTES a second of the store's time) and the next waits for it, 503
    past HEAVY_WAIT; another user's polls do not wait."""
    monkeypatch.setattr(frontend_module, "HEAVY_BURST", 1.0)
    monkeypatch.setattr(frontend_module, "DOC_BYTES", 1000)  # ~1 s a request answered
    config = frontend_config(store_config, pki, files_db, tmp_path)
    dave, carol = cert_files(pki, "dave"), cert_files(pki, "carol")
    admin.db(files_db).bulk_write([sample_request("dave") for _ in range(20)])
    poll = f"/{files_db}/_changes?feed=longpoll&include_docs=true&since=0&limit=20&timeout=5000"
    with frontend_in_process(running_reactor, config) as url:
        first = call(url, pki, dave, "GET", poll)
        assert first.status_code == 200 and first.json()["results"], first.text[:300]
        # Spent past its 1 s allowance: the next would wait 4 s a second spent, past HEAVY_WAIT
        assert len(first.content) > 1000 * (1 + frontend_module.HEAVY_WAIT / 4)
        spent = call(url, pki, dave, "GET", poll)
        assert spent.status_code == 503, spent.text[:300]
        assert spent.json()["error"] == "too_costly" and int(spent.headers["retry-after"]) > 30
        others = call(url, pki, carol, "GET", poll)
        assert others.status_code == 200 and others.json()["results"], others.text[:300]


@pytest.mark.parametrize("read", ["by keys", "changes batch"])
def test_a_user_s_reads_with_documents_are_paced_by_their_bytes(
    running_reactor, store_config, pki, files_db, tmp_path, admin, monkeypatch, read
):
    """Red team round 26: reads that carry documents in batches were charged only the time the
    store took to start its answer (alice: `_all_docs` by 100 keys with their documents, 57
    MB/s; `_changes` batches of 500 or 1000 with documents, the store's memory to 1 GB). Their
    bytes are spent from the user's heavy share as a long poll's are (DOC_BYTES a second of
    the store's time), the next waits for it, 503 past HEAVY_WAIT; another user's go."""
    monkeypatch.setattr(frontend_module, "HEAVY_BURST", 1.0)
    monkeypatch.setattr(frontend_module, "DOC_BYTES", 1000)  # ~1 s a request answered
    config = frontend_config(store_config, pki, files_db, tmp_path)
    dave, carol = cert_files(pki, "dave"), cert_files(pki, "carol")
    docs = [sample_request("dave") for _ in range(20)]
    admin.db(files_db).bulk_write(docs)
    keys = {"keys": [d["_id"] for d in docs]}
    path, body = {
        "by keys": (f"/{files_db}/_all_docs?include_docs=true", keys),
        "changes batch": (f"/{files_db}/_changes?include_docs=true&since=0&limit=20", None),
    }[read]
    method = "POST" if body else "GET"
    with frontend_in_process(running_reactor, config) as url:
        first = call(url, pki, dave, method, path, json=body)
        assert first.status_code == 200, first.text[:300]
        assert len(first.content) > 1000 * (1 + frontend_module.HEAVY_WAIT / 4)
        spent = call(url, pki, dave, method, path, json=body)
        assert spent.status_code == 503, spent.text[:300]
        assert spent.json()["error"] == "too_costly" and int(spent.headers["retry-after"]) > 30
        others = call(url, pki, carol, method, path, json=body)
        assert others.status_code == 200, others.text[:300]


@pytest.mark.parametrize("read", ["page", "database", "poll from now"])
def test_a_user_s_other_reads_are_paced_by_their_share_of_the_store(
    running_reactor, store_config, pki, files_db, tmp_path, monkeypatch, read
):
    """Red team round 28: a user's reads that are not heavy (pages of a view, the database's
    information, long polls without documents that end at once) went four at a time and were
    never charged: one user kept the embedded store ~100 % busy, bob's page 75 times slower.
    Each spends its cost of the user's light share before it goes (a long poll more), a page
    also what it took beyond; the next waits for it, 503 `too_costly` past HEAVY_WAIT; another
    user's go at once."""
    # A read's cost (5 s) is above what any read here takes on a loaded machine, so no read of
    # the burst is charged beyond it; the third one's cost takes 50 s to earn.
    monkeypatch.setattr(frontend_module, "LIGHT_BURST", 10.0)
    monkeypatch.setattr(frontend_module, "LIGHT_COST", 5.0)
    monkeypatch.setattr(frontend_module, "POLL_COST", 5.0)
    monkeypatch.setattr(frontend_module, "LIGHT_SHARE", 0.1)
    config = frontend_config(store_config, pki, files_db, tmp_path)
    dave, carol = cert_files(pki, "dave"), cert_files(pki, "carol")
    path = {
        "page": f"/{files_db}/_design/asyncstageout/_view/by_task?limit=10",
        "database": f"/{files_db}",
        "poll from now": f"/{files_db}/_changes?feed=longpoll&since=now&timeout=100",
    }[read]
    with frontend_in_process(running_reactor, config) as url:
        warm = call(url, pki, carol, "GET", path)  # the view built: dave pays his reads alone
        assert warm.status_code == 200, warm.text[:300]
        for _ in range(2):  # the burst: at once
            started = time.monotonic()
            answer = call(url, pki, dave, "GET", path)
            assert answer.status_code == 200, answer.text[:300]
            assert time.monotonic() - started < 15
        spent = call(url, pki, dave, "GET", path)
        assert spent.status_code == 503, spent.text[:300]
        assert spent.json()["error"] == "too_costly" and "reads have held" in spent.json()["reason"]
        assert int(spent.headers["retry-after"]) > frontend_module.HEAVY_WAIT
        others = call(url, pki, carol, "GET", path)
        assert others.status_code == 200, others.text[:300]


def test_a_filtered_long_poll_s_catch_up_waits_for_its_user_s_share_and_is_charged(
    running_reactor, store_config, pki, files_db, tmp_path, admin, monkeypatch
):
    """Red team round 27: a user's filtered long poll from an old `since` is first asked as a
    batch, which scanned the feed without waiting for the user's share nor being charged (alice's
    share spent, ten of them still answered 67 MB), and whose scans, cut at the poll's end,
    piled up at the store. It waits for the share as a batch does (503 too_costly once spent),
    and its time and bytes are spent from it."""
    monkeypatch.setattr(frontend_module, "HEAVY_BURST", 1.0)
    monkeypatch.setattr(frontend_module, "DOC_BYTES", 1000)  # ~1 s a request answered
    config = frontend_config(store_config, pki, files_db, tmp_path)
    dave, carol = cert_files(pki, "dave"), cert_files(pki, "carol")
    docs = [sample_request("dave") for _ in range(20)]
    admin.db(files_db).bulk_write(docs)
    poll = f"/{files_db}/_changes?feed=longpoll&filter=_doc_ids&include_docs=true&since=0"
    body = {"doc_ids": [d["_id"] for d in docs]}
    with frontend_in_process(running_reactor, config) as url:
        first = call(url, pki, dave, "POST", poll + "&timeout=5000", json=body)
        assert first.status_code == 200 and first.json()["results"], first.text[:300]
        assert len(first.content) > 1000 * (1 + frontend_module.HEAVY_WAIT / 4)
        spent = call(url, pki, dave, "POST", poll + "&timeout=1", json=body)
        assert spent.status_code == 503, spent.text[:300]
        assert spent.json()["error"] == "too_costly" and int(spent.headers["retry-after"]) > 30
        batch = f"/{files_db}/_changes?filter=_doc_ids&since=0&limit=5"
        assert call(url, pki, dave, "POST", batch, json=body).status_code == 503  # as a batch
        others = call(url, pki, carol, "POST", poll + "&timeout=5000", json=body)
        assert others.status_code == 200 and others.json()["results"], others.text[:300]


def test_a_long_poll_s_answer_holds_its_turn_until_its_client_has_read_it(
    running_reactor, store_config, pki, files_db, tmp_path, monkeypatch
):
    """Red team round 18: a long poll's answer was written to the connection at once and the
    poll ended there, its turns given back: a client that read nothing and sent its polls one
    after the other on one connection grew the front end by 1.4 GB (40 answers of 43 MB). It
    goes out as its client reads it, the poll's turns held until then (or the cut): a user's
    next poll with documents waits for it; another user's read does not."""
    monkeypatch.setattr(frontend_module._PacedBody, "resumeProducing", lambda self: None)
    config = frontend_config(store_config, pki, files_db, tmp_path)
    dave, carol = cert_files(pki, "dave"), cert_files(pki, "carol")
    doc = sample_request("dave")
    poll = f"/{files_db}/_changes?feed=longpoll&include_docs=true&since=0&timeout=5000"
    with frontend_in_process(running_reactor, config) as url:
        assert call(url, pki, dave, "PUT", f"/{files_db}/{doc['_id']}", json=doc).status_code == 201
        sock = connect(url, client_context(pki.ca_file, *dave))
        try:
            sock.sendall(f"GET {poll} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            time.sleep(2)  # answered at once (a change since 0), and not read
            again = requests.get(url + poll, cert=dave, verify=str(pki.ca_file), timeout=60)
            assert again.status_code == 503, again.text[:300]  # dave's queue: held
            other = call(url, pki, carol, "GET", f"/{files_db}/{HEAVY_READ}")
            assert other.status_code == 200, other.text[:300]
        finally:
            sock.close()


def test_a_relay_paused_by_its_client_gives_back_its_shared_slot_once():
    """Red team round 18: two users' heavy reads that their clients did not read held both
    shared slots until the cut (60 s), longer than another user waits (30 s); sent again at
    each cut, everyone else's heavy reads were 503. The store's side of a relay tells the
    first pause by its client (the shared slot goes back; the user's own queue stays)."""
    calls: list[str] = []

    class Store:
        def pauseProducing(self) -> None:
            calls.append("pause")

        def resumeProducing(self) -> None:
            calls.append("resume")

        def stopProducing(self) -> None:
            calls.append("stop")

    producer = frontend_module._TellsPause(Store(), lambda: calls.append("shared back"))
    producer.pauseProducing()
    producer.resumeProducing()
    producer.pauseProducing()
    producer.stopProducing()
    assert calls == ["shared back", "pause", "resume", "pause", "stop"]


def test_paced_large_writes_do_not_hold_the_large_body_slots(
    running_reactor, store_config, pki, files_db, tmp_path
):
    """Red team round 18: a user's large write held a large body's slot while it waited for
    its user's write turn and its documents' pace, so two users' paced writes held both and
    another user's large body waited 27 s. The slot is given back while the write waits, and
    taken again to send it."""
    config = frontend_config(store_config, pki, files_db, tmp_path)
    config.frontend = dataclasses.replace(config.frontend, user_docs_per_second=5)
    certs = {who: cert_files(pki, who) for who in ("dave", "carol", "erin")}
    wide = "/CN=" + "x" * 1000  # 1,000 documents over BIG_BODY
    bulk = lambda who: {"docs": [dict(sample_request(who), user_dn=wide)  # noqa: E731
                                 for _ in range(1000)]}  # fmt: skip
    keys = {"keys": [f"{i:04d}" + "k" * 1100 for i in range(1000)]}
    assert len(json.dumps(keys)) > frontend_module.BIG_BODY
    with frontend_in_process(running_reactor, config) as url, ThreadPoolExecutor(2) as pool:
        for who in ("dave", "carol"):  # the burst: at once (1,000 wide documents validated:
            # over 30 s on CouchDB on a loaded 2-core machine)
            sent = requests.post(url + f"/{files_db}/_bulk_docs", json=bulk(who),
                                 cert=certs[who], verify=str(pki.ca_file), timeout=120)  # fmt: skip
            assert sent.status_code == 201, sent.text[:300]
        waiting = [pool.submit(requests.post, url + f"/{files_db}/_bulk_docs", json=bulk(who),
                               cert=certs[who], verify=str(pki.ca_file), timeout=45)
                   for who in ("dave", "carol")]  # fmt: skip
        time.sleep(3)  # both paced: 200 s at 5 documents a second
        read = requests.post(url + f"/{files_db}/_all_docs", json=keys, cert=certs["erin"],
                             verify=str(pki.ca_file), timeout=60)  # fmt: skip
        assert read.status_code == 200, read.text[:300]  # not 503: no slot waited for
        for paced in waiting:
            with pytest.raises(requests.exceptions.ReadTimeout):
                paced.result(60)


def test_a_user_s_heavy_read_that_holds_the_store_too_long_is_refused(
    running_reactor, store_config, pki, files_db, tmp_path, admin, monkeypatch
):
    """Red team round 19: two users' grouped reads, 29 s each on the embedded store, sent back
    to back, held both shared heavy slots, and an operator's heavy reads waited 24-28 s. A
    user's heavy read whose answer has not started within USER_HEAVY_WORK is refused 503, its
    turn kept until the store has answered (the embedded store goes on with the work whatever
    the client does); operators' and agents' heavy reads have slots of their own and no such
    bound."""
    monkeypatch.setattr(frontend_module, "USER_HEAVY_WORK", 0.05)
    config = frontend_config(store_config, pki, files_db, tmp_path)
    certs = {who: cert_files(pki, who) for who in ("dave", "operator-x")}
    grouped = f"/{files_db}/_design/asyncstageout/_view/task_states?group=true"

    def index_behind() -> None:  # a view's next read indexes 3,000 documents first
        admin.db(files_db).bulk_write([sample_request("dave") for _ in range(3000)])

    with frontend_in_process(running_reactor, config) as url:
        index_behind()
        stopped = call(url, pki, certs["dave"], "GET", grouped)
        assert stopped.status_code == 503, stopped.text[:300]
        assert stopped.json()["error"] == "too_costly"
        assert "a narrower key range" in stopped.json()["reason"]
        index_behind()
        operators = call(url, pki, certs["operator-x"], "GET", grouped)
        assert operators.status_code == 200, operators.text[:300]
        assert sum(row["value"] for row in operators.json()["rows"]) >= 6000
        # dave's next heavy read, with the bound back: 0.05 s is no time for a store under load
        monkeypatch.setattr(frontend_module, "USER_HEAVY_WORK", 20.0)
        docs = call(
            url,
            pki,
            certs["dave"],
            "GET",
            f"/{files_db}/_all_docs?include_docs=true&limit=2&startkey=%22%60%22",
        )
        assert docs.status_code == 200, docs.text[:300]  # the turn came back
        assert len(docs.json()["rows"]) == 2


def test_an_operator_s_costly_reduce_read_is_shared_while_it_is_fresh(
    running_reactor, store_config, pki, files_db, tmp_path, admin, monkeypatch
):
    """Red team round 24: a user's 30,000-file task cost the embedded store 2.4-3.3 s of
    reduce at every refresh of an operator's task page (alice's link 11.9 s). An operator's
    reduce read that cost the store is kept for ten times its cost and given to the next
    operators who ask, with its Age; another read of it waits for the one under way. A user's
    reads are never answered from it."""
    monkeypatch.setattr(shared_module, "MIN_COST", 0.0)  # every answer costly enough to keep,
    monkeypatch.setattr(shared_module, "FRESH_PER_COST", 1e6)  # and for MAX_FRESH
    config = frontend_config(store_config, pki, files_db, tmp_path)
    certs = {who: cert_files(pki, who) for who in ("dave", "operator-x")}
    grouped = f"/{files_db}/_design/asyncstageout/_view/task_states?group_level=2"
    counted = f"/{files_db}/_design/asyncstageout/_view/task_states?group_level=1"
    files = admin.db(files_db)

    def files_of(answer: Any) -> int:
        return sum(row["value"] for row in answer.json()["rows"])

    with frontend_in_process(running_reactor, config) as url:
        files.bulk_write([sample_request("dave") for _ in range(3)])
        first = call(url, pki, certs["operator-x"], "GET", grouped)
        assert first.status_code == 200 and "age" not in first.headers
        files.bulk_write([sample_request("dave") for _ in range(2)])
        kept = call(url, pki, certs["operator-x"], "GET", grouped)
        assert kept.status_code == 200, kept.text[:300]
        assert int(kept.headers["age"]) >= 0 and kept.content == first.content
        assert files_of(kept) == files_of(first)  # the two new files not counted yet
        users = call(url, pki, certs["dave"], "GET", grouped)
        assert users.status_code == 200 and "age" not in users.headers
        # a row a file on each of three axes and its `final`
        assert files_of(users) == files_of(first) + 2 * 4

        files.bulk_write([sample_request("dave") for _ in range(3000)])  # a read that takes a while
        with ThreadPoolExecutor(2) as pool:
            leading = pool.submit(call, url, pki, certs["operator-x"], "GET", counted)
            time.sleep(0.2)
            joining = pool.submit(call, url, pki, certs["operator-x"], "GET", counted)
            answers = [leading.result(), joining.result()]
        assert [a.status_code for a in answers] == [200, 200]
        # which of the two reaches the front end first is the machine's to decide (TLS set-up)
        assert sorted("age" in a.headers for a in answers) == [False, True]
        assert answers[0].content == answers[1].content
        assert files_of(answers[1]) == files_of(users) + 4 * 3000  # four rows a file


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_an_operator_s_task_page_says_when_its_counts_were_kept(
    running_reactor, store_config, pki, files_db, tmp_path, admin, monkeypatch
):
    """The task page of an operator whose counts came kept (their Age) says how old they are;
    counted afresh, it says nothing."""
    monkeypatch.setattr(shared_module, "MIN_COST", 0.0)
    monkeypatch.setattr(shared_module, "FRESH_PER_COST", 1e6)
    config = frontend_config(store_config, pki, files_db, tmp_path)
    task = f"261130_{uuid.uuid4().hex[:6]}:erin_crab_kept"
    admin.db(files_db).bulk_write([sample_request("erin", task=task) for _ in range(3)])
    p12 = write_pkcs12(tmp_path / "op.p12", pki.user("operator-x"), pki.ca, b"p12-password")
    with frontend_in_process(running_reactor, config) as url:
        address = pages_url(config, url) + "#task/" + task
        certificate = {"origin": url, "pfxPath": str(p12), "passphrase": "p12-password"}
        with browser(client_certificates=[certificate], ignore_https_errors=True) as context:
            page = context.new_page()
            page.goto(address)
            page.wait_for_selector("table#task-counts")
            assert page.locator("#task-counted").count() == 0
            page.reload()
            page.wait_for_selector("table#task-counts")
            expect(page.locator("#task-counted")).to_contain_text("s ago")
            expect(page.locator("#task-counts")).to_contain_text("3 in all")


def test_shared_reads_keep_a_costly_answer_for_ten_times_its_cost():
    """SharedReads: a read under way is joined; its answer kept FRESH_PER_COST times its cost
    if that was at least MIN_COST, never past MAX_FRESH, never a refusal or an answer over
    MAX_ANSWER_BYTES, all kept bytes bounded."""
    now = [100.0]
    reads = shared_module.SharedReads(clock=lambda: now[0])

    def answer(body: bytes = b"{}", code: int = 200) -> shared_module.Answer:
        return shared_module.Answer(code, b"OK", None, body, now[0])

    lead = reads.lead(b"k")
    joined: list[Any] = []
    reads.join(b"k").addCallback(joined.append)
    assert reads.join(b"other") is None and reads.fresh(b"k") is None
    lead.done(answer(b"rows"), cost=2.0)
    lead.done(None)  # once: a second ending changes nothing
    assert [a.body for a in joined] == [b"rows"] and b"k" not in reads.under_way
    now[0] += 19.9
    assert reads.fresh(b"k") is not None
    now[0] += 0.2
    assert reads.fresh(b"k") is None and reads.kept_bytes == 0

    reads.lead(b"cheap").done(answer(), cost=shared_module.MIN_COST / 2)
    reads.lead(b"long").done(answer(), cost=10_000.0)
    refused: list[Any] = []
    refusing = reads.lead(b"refused")
    reads.join(b"refused").addCallback(refused.append)
    refusing.done(answer(code=304), cost=5.0)
    big = b"x" * (shared_module.MAX_ANSWER_BYTES + 1)
    reads.lead(b"big").done(answer(big), cost=5.0)
    assert refused == [None] and set(reads.kept) == {b"long"}
    now[0] += shared_module.MAX_FRESH
    assert reads.fresh(b"long") is None

    many = shared_module.MAX_KEPT_BYTES // shared_module.MAX_ANSWER_BYTES + 2
    for i in range(many):
        reads.lead(b"%d" % i).done(answer(b"x" * shared_module.MAX_ANSWER_BYTES), cost=1.0 + i)
    assert reads.kept_bytes <= shared_module.MAX_KEPT_BYTES
    assert b"0" not in reads.kept and b"%d" % (many - 1) in reads.kept  # the first stale, gone


def test_operators_heavy_reads_do_not_wait_behind_users():
    """Slots: the users' shared slots all taken, an operator's (a service's) heavy read takes
    one of the service's own at once; another user's waits."""
    from twisted.internet.task import Clock

    slots = frontend_module.Slots(Clock(), 1, "heavy reads", for_services=1)
    alices = slots.take("alice")
    bobs = slots.take("bob")
    operators = slots.take("operator-x", service=True)

    def given(taken: Any) -> bool:
        return isinstance(getattr(taken, "result", None), frontend_module.Turn)

    assert given(alices) and given(operators) and not given(bobs)
    turn = alices.result
    turn.share_back()  # alice's store work done: bob's turn
    assert given(bobs)
    for taken in (turn, bobs.result, operators.result):
        taken()
    assert slots.shared.tokens == 1 and slots.services.tokens == 1 and slots.of == {}


def test_a_turn_asked_for_a_request_that_has_ended_is_not_given():
    """Slots.take_for: notifyFinish never fires for a request that has ended, so a turn given
    to one would never be given back; its wait ends at once."""
    from twisted.internet.defer import CancelledError
    from twisted.internet.task import Clock
    from twisted.web.test.requesthelper import DummyRequest

    slots = frontend_module.Slots(Clock(), 2, "heavy reads")
    request = DummyRequest([b""])
    request.finish()
    outcome: list[Any] = []
    slots.take_for(request, "dave").addBoth(outcome.append)
    assert outcome and outcome[0].check(CancelledError)
    assert slots.shared.tokens == 2 and not slots.of


def test_a_creation_s_answer_is_parsed_for_conflicts_only_when_it_has_one(
    running_reactor, store_config, pki, files_db, tmp_path, monkeypatch
):
    """Every creation's body (9 MB of them) had been parsed again on the reactor's thread to
    look for conflicts: now only an answer that names a conflict is, and in a thread."""
    from twisted.python.threadable import isInIOThread

    calls: list[bool] = []
    real = frontend_module.conflicts_of

    def recorded(made: Any, answer: bytes) -> Any:
        calls.append(isInIOThread())
        return real(made, answer)

    monkeypatch.setattr(frontend_module, "conflicts_of", recorded)
    config = frontend_config(store_config, pki, files_db, tmp_path)
    dave = cert_files(pki, "dave")
    docs = [sample_request("dave") for _ in range(3)]
    with frontend_in_process(running_reactor, config) as url:
        bulk = f"/{files_db}/_bulk_docs"
        first = call(url, pki, dave, "POST", bulk, json={"docs": docs})
        assert first.status_code == 201 and all(r.get("ok") for r in first.json()), first.text
        assert calls == []
        again = call(url, pki, dave, "POST", bulk, json={"docs": docs})
        assert [r.get("error") for r in again.json()] == ["conflict"] * 3, again.text
        assert "already recorded" in again.json()[0]["reason"], again.text
    assert calls == [False]


def test_only_a_creation_of_its_own_request_is_explained_and_within_bounds(
    running_reactor, store_config, pki, files_db, tmp_path, monkeypatch
):
    """Red team round 20: 1000 creations of just `{"_id": X}`, X another's large request, made
    the front end read and parse 44 MB in its own interpreter to explain the conflicts. Only a
    creation whose id is its source LFN's request id is explained (nothing else is compared
    with a stored request), in its user's heavy turn, from at most EXPLAIN_BYTES of stored
    requests; past that the conflicts are told as the store told them."""
    reads: list[bytes] = []
    real = frontend_module._read_bounded

    def counted(response: Any, limit: int) -> Any:
        reads.append(b"read")
        return real(response, limit)

    monkeypatch.setattr(frontend_module, "_read_bounded", counted)
    config = frontend_config(store_config, pki, files_db, tmp_path)
    dave, erin = cert_files(pki, "dave"), cert_files(pki, "erin")
    docs = [sample_request("dave") for _ in range(3)]
    bulk = f"/{files_db}/_bulk_docs"
    with frontend_in_process(running_reactor, config) as url:
        assert call(url, pki, dave, "POST", bulk, json={"docs": docs}).status_code == 201
        bare = [{"_id": d["_id"]} for d in docs]
        for who in (dave, erin):  # the owner or another user: no request of its id
            answer = call(url, pki, who, "POST", bulk, json={"docs": bare})
            assert [r.get("error") for r in answer.json()] == ["conflict"] * 3, answer.text
            assert not any("recorded" in r["reason"] or "user's" in r["reason"]
                           for r in answer.json()), answer.text  # fmt: skip
        assert reads == []
        again = call(url, pki, dave, "POST", bulk, json={"docs": docs})
        assert [r["reason"] for r in again.json()] == [upload.ALREADY_RECORDED] * 3
        assert reads == [b"read"]
        monkeypatch.setattr(frontend_module, "EXPLAIN_BYTES", 100)
        bounded = call(url, pki, dave, "POST", bulk, json={"docs": docs})
        assert [r.get("error") for r in bounded.json()] == ["conflict"] * 3, bounded.text
        assert upload.ALREADY_RECORDED not in {r["reason"] for r in bounded.json()}
        assert reads == [b"read"] * 2


def finish_with(request: Any, status: int) -> None:
    """(On the reactor.) A request answered as the store would have."""
    if not request.finished:
        request.setResponseCode(status)
        request.write(b'{"ok": true}\n')
        request.finish()


def read_to_end(connection: Any) -> bytes:
    answer = b""
    with contextlib.suppress(OSError):
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


def test_a_client_gone_before_its_check_ends_gets_nothing_and_breaks_nothing(
    running_reactor, store_config, pki, files_db, tmp_path, monkeypatch
):
    """A client that leaves while its certificate is checked: the answer is not written to
    a closed connection, and the next client is served."""
    checked, release = threading.Event(), threading.Event()
    verify = frontend_module.verify_chain

    def held(chain: Any, trust: Any, **kw: Any) -> Any:
        identity = verify(chain, trust, **kw)
        if identity.dn.endswith("CN=dave"):
            checked.set()
            assert release.wait(120)
        return identity

    monkeypatch.setattr(frontend_module, "verify_chain", held)
    config = frontend_config(store_config, pki, files_db, tmp_path)
    with frontend_in_process(running_reactor, config) as url:
        with ThreadPoolExecutor(1) as pool:
            gone = pool.submit(
                requests.get, f"{url}/{files_db}", cert=cert_files(pki, "dave"),
                verify=str(pki.ca_file), timeout=2,
            )  # fmt: skip
            assert checked.wait(60)
            with pytest.raises(requests.exceptions.ReadTimeout):
                gone.result(60)  # the client gave up and closed its connection
            release.set()
        answer = call(url, pki, cert_files(pki, "carol"), "GET", f"/{files_db}")
        assert answer.status_code == 200, answer.text


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_a_browser_with_a_certificate_opens_the_pages_through_the_front_end(
    frontend, pki, files_db, store_config, tmp_path
):
    """The certificate route of docs/frontend.md end to end: a user's PKCS#12 file (as `aso
    certs demo` writes it) in Chromium opens the pages' address on the front end as that user,
    with no login page; without a certificate the front end lets nothing through."""
    p12 = write_pkcs12(tmp_path / "carol.p12", pki.user("carol"), pki.ca, b"p12-password")
    config = dataclasses.replace(
        store_config, store=dataclasses.replace(store_config.store, files_db=files_db)
    )
    address = pages_url(config, frontend)
    certificate = {"origin": frontend, "pfxPath": str(p12), "passphrase": "p12-password"}
    # The demo CA is not among Chromium's authorities here (a person imports it: the docs).
    with browser(client_certificates=[certificate], ignore_https_errors=True) as context:
        page = context.new_page()
        page.goto(address + "#agents")
        page.wait_for_selector("table#agents")
        expect(page.locator("#who")).to_contain_text("carol")
        assert page.locator("form#login").count() == 0 and page.locator("#logout").count() == 0
        page.screenshot(path=str(ARTEFACTS / "frontend-agents.png"), full_page=True)
    with browser(ignore_https_errors=True) as context:
        page = context.new_page()
        try:
            response = page.goto(address)
        except Exception as exc:  # the TLS handshake refused without a certificate
            assert "ERR_" in str(exc), exc
        else:
            assert response is not None and response.status == 401
            assert "certificate" in response.json()["reason"]


def test_every_answer_says_its_content_type_is_not_to_be_sniffed(frontend, pki, files_db):
    """Red team round 26: a 400 quoting the request's query (a `<script>` in a parameter's
    name) went out as JSON without nosniff. Every answer, refusals and the store's, says it."""
    dave = cert_files(pki, "dave")
    for path in (f"/{files_db}/_all_docs?<script>alert(1)</script>=1", f"/{files_db}", "/_session"):
        answer = call(frontend, pki, dave, "GET", path)
        assert answer.headers["x-content-type-options"] == "nosniff", (path, answer.status_code)
    anonymous = requests.get(frontend + "/_session", verify=str(pki.ca_file), timeout=30)
    assert anonymous.headers["x-content-type-options"] == "nosniff"


def test_a_user_ends_only_their_own_hold_through_the_front_end(frontend, pki, files_db, admin):
    """A hold (started by the agents) is released or cancelled by its user through the front
    end's typed route; another user's write of it is refused, as is a user's start of a hold,
    whatever route it takes; an operator ends anyone's."""
    from aso.config import HoldsConfig
    from aso.core import holds

    dave, carol = cert_files(pki, "dave"), cert_files(pki, "carol")
    operator = cert_files(pki, "operator-x")
    agents = admin.db(files_db)
    now = time.time()

    def start(user: str) -> dict:
        doc = holds.started(None, site="T2_DE_DESY", user=user, error_class="quota",
                            reason="no space left", path=f"/store/user/{user}", needs=10,
                            by="agent", now=now, config=HoldsConfig())  # fmt: skip
        assert doc is not None
        doc["_rev"] = agents.put(doc)
        return doc

    daves, carols = start("dave"), start("carol")
    path = f"/{files_db}/{daves['_id']}"
    # carol neither ends dave's hold nor starts one, by any route.
    theirs = holds.ended(daves, model.HOLD_RELEASED, "mine", "carol", time.time(), by_owner=True)
    fresh = {k: v for k, v in start_doc(carols, "T2_IT_Pisa").items() if k != "_rev"}
    for method, target, body in [
        ("PUT", path, theirs),
        ("POST", f"/{files_db}", theirs),
        ("POST", f"/{files_db}/_bulk_docs", {"docs": [theirs]}),
        ("PUT", f"/{files_db}/{fresh['_id']}", fresh),
        ("DELETE", f"{path}?rev={daves['_rev']}", None),
    ]:
        answer = call(frontend, pki, carol, method, target, json=body)
        assert answer.status_code in (400, 403, 405), (method, target, answer.text[:300])
        assert answer.json()["reason"], answer.text[:300]
    assert agents.get(daves["_id"])["_rev"] == daves["_rev"]
    # dave reads his hold and cancels it; an operator releases carol's.
    seen = call(frontend, pki, dave, "GET", path)
    assert seen.status_code == 200 and seen.json()["state"] == model.HOLD_ACTIVE
    cancel = holds.ended(seen.json(), model.HOLD_CANCELLED, "enough", "dave", time.time(),
                         by_owner=True)  # fmt: skip
    taken = call(frontend, pki, dave, "PUT", path, json=cancel)
    assert taken.status_code == 201, taken.text[:300]
    assert agents.get(daves["_id"])["state"] == model.HOLD_CANCELLED
    release = holds.ended(carols, model.HOLD_RELEASED, "room added", "operator-x", time.time(),
                          by_owner=True)  # fmt: skip
    taken = call(frontend, pki, operator, "PUT", f"/{files_db}/{carols['_id']}", json=release)
    assert taken.status_code == 201, taken.text[:300]


def start_doc(hold: dict, site: str) -> dict:
    """`hold` as if started at another site (an agent's document, written by someone else)."""
    return {**hold, "_id": model.hold_id(site, hold["user"]), "site": site}


def test_only_an_operator_sets_a_control_through_the_front_end(frontend, pki, files_db):
    """A user's write of an operator's control (a site ban) is refused whatever its route; an
    operator's is taken, and the user reads it (why their files wait)."""
    from aso.core.controls import changed

    dave, operator = cert_files(pki, "dave"), cert_files(pki, "operator-x")
    doc_id = model.control_id(model.SITE, "T2_DE_DESY")
    mine = changed(None, model.SITE, "T2_DE_DESY", model.BAN, "mine", "dave", time.time())
    for method, path, body in [
        ("PUT", f"/{files_db}/{doc_id}", mine),
        ("POST", f"/{files_db}", mine),
        ("POST", f"/{files_db}/_bulk_docs", {"docs": [mine]}),
    ]:
        answer = call(frontend, pki, dave, method, path, json=body)
        assert answer.status_code in (400, 403), (method, path, answer.text[:300])
        assert answer.json()["reason"], answer.text[:300]
    set_by = changed(None, model.SITE, "T2_DE_DESY", model.BAN, "disk", "operator-x", time.time())
    taken = call(frontend, pki, operator, "PUT", f"/{files_db}/{doc_id}", json=set_by)
    assert taken.status_code == 201, taken.text[:300]
    seen = call(frontend, pki, dave, "GET", f"/{files_db}/{doc_id}")
    assert seen.status_code == 200 and seen.json()["reason"] == "disk"
    forged = {**changed(seen.json(), model.SITE, "T2_DE_DESY", model.ALLOW, "", "dave", 1.0)}
    answer = call(frontend, pki, dave, "PUT", f"/{files_db}/{doc_id}", json=forged)
    assert answer.status_code in (400, 403), answer.text[:300]
