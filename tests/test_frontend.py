"""The X.509 front end (`aso frontend`, a real Twisted HTTPS server in its own process) in front
of the embedded store: which certificates and proxies get in, with what answer, and what the
users behind them may do (the store's validate_doc_update and _security, seen through it)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from aso import model
from aso.config import Config
from aso.embedded import free_port
from aso.model import AGENT, STATE, Change
from aso.pki import CertificateAuthority, Pki, make_proxy
from aso.store import Server
from tests.conftest import sample_request, write_config

ASO = str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "aso")
PAST = dt.datetime.now(dt.UTC) - dt.timedelta(days=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    pki = Pki.create(tmp_path_factory.mktemp("pki"))
    lines = [
        f'"{pki.user(u).dn}" {u}' for u in ("carol", "dave")
    ] + [  # the revoked user is mapped: only the CRL keeps it out
        f'"{pki.user("agent-host").dn}" agent-host aso-agent',
        f'"{pki.user("operator-x").dn}" operator-x aso-admin',
        f'"{pki.user("mallory").dn}" mallory',
    ]
    (pki.root / "grid-mapfile").write_text("# test\n" + "\n".join(lines) + "\n")
    pki.revoke(pki.user("mallory").cert)
    return pki


@pytest.fixture(scope="module")
def frontend(
    store_config: Config, pki: Pki, files_db: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    base = tmp_path_factory.mktemp("frontend")
    port = free_port()
    config = dataclasses.replace(
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
    )
    write_config(config)
    log = base / "frontend.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [ASO, "--config", str(config.source), "frontend"], stdout=out, stderr=subprocess.STDOUT
        )
    url = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while "listening" not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(30)


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


def test_agents_and_operators_act_in_their_roles(frontend, pki, files_db, admin):
    carol, agent = cert_files(pki, "carol"), cert_files(pki, "agent-host")
    operator = cert_files(pki, "operator-x")
    doc = sample_request("carol")
    assert call(frontend, pki, carol, "POST", f"/{files_db}", json=doc).status_code == 201
    current = admin.db(files_db).get(doc["_id"])
    acquired = model.transition(current, [Change(STATE, "acquired", "agent-host")], AGENT)
    # Alice cannot make the agents' transition; the agent can.
    assert (
        call(frontend, pki, carol, "PUT", f"/{files_db}/{doc['_id']}", json=acquired).status_code
        == 403
    )
    answer = call(frontend, pki, agent, "PUT", f"/{files_db}/{doc['_id']}", json=acquired)
    assert answer.status_code == 201, answer.text
    design = {"_id": "_design/operator_test", "views": {}}
    answer = call(frontend, pki, operator, "PUT", f"/{files_db}/_design/operator_test", json=design)
    assert answer.status_code == 201, answer.text


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
