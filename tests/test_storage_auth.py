"""The embedded sites authenticate and authorise as grid sites do (issue 37): real XRootD, real
clients (xrdcp/xrdfs for root://, raw HTTP(S) for XrdHttp, gfal2 for the job's own write), each
with a credential of the test PKI (tests/storage_helpers.shared_pki). Refusals are checked at
the storage's disk as well: nothing written, nothing deleted."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import os
import ssl
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from aso.config import Config
from aso.grid.certs import tls_files
from aso.local import pki
from aso.local.xrootd import EmbeddedStorage, export_path, write_file
from tests.storage_helpers import reachable_tmp_dir, shared_pki, storage_config

SITE = "T2_CH_CERN"
OTHER = "T2_IT_Pisa"
Credential = tuple[str, ...]  # ("proxy", path) | ("cert", cert, key) | ()
ANONYMOUS: Credential = ()


@pytest.fixture(scope="module")
def storage() -> Iterator[Config]:
    with reachable_tmp_dir() as base:
        config = storage_config(base, [SITE, OTHER], protocol="https")
        embedded = EmbeddedStorage(config)
        embedded.start()
        try:
            yield config
        finally:
            embedded.stop()


def proxy(who: str) -> Credential:
    return ("proxy", str(shared_pki() / f"x509up_{who}"))


def agent() -> Credential:
    certs = shared_pki()
    return ("cert", str(certs / "aso-agent-host-cert.pem"), str(certs / "aso-agent-host-key.pem"))


def _alice() -> pki.Credential:
    certs = shared_pki()
    return pki.load_credential(certs / "alice-cert.pem", certs / "alice-key.pem")


@pytest.fixture(scope="module")
def forged(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Credential]:
    """Credentials that must not pass: alice's DN from a CA of the same name that the sites do
    not trust; an expired proxy of alice's. And one that must: a proxy of alice's proxy."""
    root = tmp_path_factory.mktemp("forged")
    root.chmod(0o755)
    evil = pki.Pki.create(root / "evil")
    alice = _alice()
    expired_start = dt.datetime.now(dt.UTC) - dt.timedelta(hours=3)
    expired = pki.make_proxy(alice, dt.timedelta(hours=1), start=expired_start)
    return {
        "untrusted": ("proxy", str(evil.proxy_file(evil.user("alice")))),
        "expired": ("proxy", str(pki.write_proxy(root / "expired", expired))),
        "proxy-of-proxy": (
            "proxy",
            str(pki.write_proxy(root / "pp", pki.make_proxy(pki.make_proxy(alice)))),
        ),
    }


# -- clients --------------------------------------------------------------------------------------
def _client_env(config: Config, credential: Credential) -> dict[str, str]:
    files = tls_files(config)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "X509_CERT_DIR": str(files.ca_dir),
        "XrdSecGSICREATEPROXY": "0",
        "XrdSecGSISRVNAMES": "localhost",
        "XRD_CONNECTIONRETRY": "1",
        "XRD_REQUESTTIMEOUT": "20",
        # Nothing of this process's own: no credential unless given.
        "X509_USER_PROXY": "/nonexistent",
        "X509_USER_CERT": "/nonexistent",
        "X509_USER_KEY": "/nonexistent",
    }
    if credential and credential[0] == "proxy":
        env["X509_USER_PROXY"] = credential[1]
    elif credential:
        env["X509_USER_CERT"], env["X509_USER_KEY"] = credential[1], credential[2]
    return env


def _root(config: Config, site: str = SITE) -> str:
    return config.sites[site].root_url


def root_put(config: Config, credential: Credential, path: str, data: bytes = b"x" * 100) -> bool:
    """xrdcp of a local file to `path` (as given: no normalisation); whether it succeeded."""
    local = Path(f"/tmp/aso-auth-{uuid.uuid4().hex}")
    local.write_bytes(data)
    local.chmod(0o644)
    try:
        done = subprocess.run(
            ["xrdcp", "-s", "-f", str(local), f"{_root(config)}/{path}"],
            env=_client_env(config, credential),
            capture_output=True,
            timeout=60,
        )
    finally:
        local.unlink()
    return done.returncode == 0


def root_rm(config: Config, credential: Credential, path: str) -> bool:
    done = subprocess.run(
        ["xrdfs", _root(config), "rm", path],
        env=_client_env(config, credential),
        capture_output=True,
        timeout=60,
    )
    return done.returncode == 0


def http_call(
    config: Config,
    credential: Credential,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    plain: bool = False,
) -> tuple[int, bytes]:
    """One raw HTTP(S) request to the site's XrdHttp port, the path sent as given."""
    parts = urlsplit(config.sites[SITE].http_url)
    host, port = parts.hostname or "", parts.port or 0
    if plain:
        connection: http.client.HTTPConnection = http.client.HTTPConnection(host, port, timeout=20)
    else:
        context = ssl.create_default_context(cafile=str(tls_files(config).ca_bundle))
        if credential and credential[0] == "proxy":
            context.load_cert_chain(credential[1])
        elif credential:
            context.load_cert_chain(credential[1], credential[2])
        connection = http.client.HTTPSConnection(host, port, timeout=20, context=context)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        answer = connection.getresponse()
        return answer.status, answer.read()
    except (ssl.SSLError, ConnectionError) as error:
        return 0, str(error).encode()  # refused in the handshake
    finally:
        connection.close()


def on_disk(config: Config, lfn: str) -> Path:
    return export_path(config, SITE, lfn)


def _temp(user: str) -> str:
    return f"/store/temp/user/{user}/{uuid.uuid4().hex}.root"


# -- who may write --------------------------------------------------------------------------------
def test_alice_writes_her_own_temporary_areas_on_both_protocols(storage: Config) -> None:
    for lfn in (_temp("alice"), f"/store/temp/user/alice.{uuid.uuid4().hex[:8]}/out.root"):
        assert root_put(storage, proxy("alice"), lfn), lfn
        assert on_disk(storage, lfn).read_bytes() == b"x" * 100
    lfn = _temp("alice")
    status, _ = http_call(storage, proxy("alice"), "PUT", lfn, b"davs")
    assert status in (200, 201), status
    assert on_disk(storage, lfn).read_bytes() == b"davs"


@pytest.mark.parametrize(
    "who,lfn",
    [
        ("anonymous", _temp("alice")),
        ("alice", _temp("bob")),  # another user's temporary area
        ("alice", f"/store/temp/user/bob.{uuid.uuid4().hex[:6]}/x.root"),  # and its .<hash> form
        ("alice", f"/store/user/bob/{uuid.uuid4().hex}.root"),  # another user's final area
        ("alice", f"/store/user/alice/{uuid.uuid4().hex}.root"),  # only the agents write there
        ("al", _temp("alice")),  # a name that is the start of another's
        ("alice", f"/store/temp/user/alicex/{uuid.uuid4().hex}.root"),  # ... and the reverse
        ("alice", f"/store/temp/{uuid.uuid4().hex}.root"),  # outside every user's area
        ("agent", _temp("bob")),  # the agents delete temporary files, never write them
    ],
)
def test_writes_outside_one_s_own_temporary_area_are_refused(
    storage: Config, who: str, lfn: str
) -> None:
    credential = {"anonymous": ANONYMOUS, "agent": agent()}.get(who, proxy(who))
    assert not root_put(storage, credential, lfn)
    status, _ = http_call(storage, credential, "PUT", lfn, b"davs")
    assert status in (0, 401, 403), status
    assert not on_disk(storage, lfn).exists()


def test_plain_http_is_anonymous_and_may_read_but_not_write_or_delete(storage: Config) -> None:
    """Any (loopback) client reads and lists: a destination's HTTP third-party pull has no
    credential at all (XrdHttpTPC 5.5.3); nothing but a mapped identity writes or deletes."""
    stored = write_file(storage, SITE, _temp("alice"), b"kept")
    for plain in (True, False):
        assert http_call(storage, ANONYMOUS, "GET", stored.lfn, plain=plain) == (200, b"kept")
        for method, body in (("PUT", b"x"), ("DELETE", b"")):
            status, _ = http_call(storage, ANONYMOUS, method, stored.lfn, body, plain=plain)
            assert status == 403, (method, plain, status)
    new = _temp("alice")
    assert http_call(storage, ANONYMOUS, "PUT", new, b"x", plain=True)[0] == 403
    assert (
        on_disk(storage, stored.lfn).read_bytes() == b"kept" and not on_disk(storage, new).exists()
    )


@pytest.mark.parametrize("kind", ["untrusted", "expired"])
def test_an_untrusted_or_expired_credential_is_refused(
    storage: Config, forged: dict[str, Credential], kind: str
) -> None:
    lfn = _temp("alice")
    assert not root_put(storage, forged[kind], lfn)
    status, _ = http_call(storage, forged[kind], "PUT", lfn, b"x")
    assert status in (0, 401, 403), status
    assert not on_disk(storage, lfn).exists()


def test_a_proxy_of_a_proxy_is_its_user(storage: Config, forged: dict[str, Credential]) -> None:
    lfn, other = _temp("alice"), _temp("bob")
    assert root_put(storage, forged["proxy-of-proxy"], lfn)
    assert http_call(storage, forged["proxy-of-proxy"], "PUT", _temp("alice"), b"x")[0] in (
        200,
        201,
    )
    assert not root_put(storage, forged["proxy-of-proxy"], other)


@pytest.mark.parametrize(
    "path",
    [
        "/store/temp/user/alice/../bob/{name}",
        "/store/temp/user/alice/%2e%2e/bob/{name}",
        "/store/temp/user/alice/%2E%2E/bob/{name}",
        "/store/temp/user/alice/..%2fbob/{name}",
        "//store/temp/user/bob/{name}",
        "/store/temp/user//bob/{name}",
        "/store/temp/user/alice/./../bob/{name}",
    ],
)
def test_path_tricks_do_not_reach_another_user_s_area(storage: Config, path: str) -> None:
    name = f"{uuid.uuid4().hex}.root"
    target = on_disk(storage, f"/store/temp/user/bob/{name}")
    wrote_root = root_put(storage, proxy("alice"), path.format(name=name))
    http_call(storage, proxy("alice"), "PUT", path.format(name=name), b"x")
    # A third-party copy's path reached the file system with its `..` (storage round 3, T1).
    mine = _temp("alice")
    assert root_put(storage, proxy("alice"), mine, b"hers")
    _copy(storage, proxy("alice"), path.format(name=name), source=_https(storage, mine))
    assert not target.exists(), (path, wrote_root)
    # A literal name (`%2e%2e` is no `..` to XRootD) inside alice's own area is hers to write.
    alice = target.parents[1] / "alice"
    assert all(alice in p.parents for p in target.parents[3].rglob(name)), "written elsewhere"


def _https(config: Config, lfn: str, site: str = SITE) -> str:
    return f"{config.sites[site].http_url}{lfn}"


@pytest.mark.parametrize("dots", ["..", "%2e%2e", ".%2e"])
def test_a_third_party_copy_s_path_does_not_climb_out_of_its_writer_s_area(
    storage: Config, dots: str
) -> None:
    """Storage round 3, T1: XrdHttpTPC 5.5.3 took a COPY's path with its `..` (plain or
    encoded) to the file system after the authdb had judged it by its first characters:
    alice's `/store/temp/user/alice/../../../user/bob/final.root` overwrote bob's final file,
    and wrote into another site's export, the site's logs and /tmp. The preloaded guard
    refuses every file call under the export that names `..`."""
    final = f"/store/user/bob/{uuid.uuid4().hex}.root"
    assert root_put(storage, agent(), final, b"bob's final file")
    mine = _temp("alice")
    assert root_put(storage, proxy("alice"), mine, b"OVERWRITTEN BY ALICE")
    climb = f"/store/temp/user/alice/{dots}/{dots}/{dots}{final.removeprefix('/store')}"
    status, body = _copy(storage, proxy("alice"), climb, source=_https(storage, mine))
    assert b"success" not in body.lower(), (status, body[:300])
    assert on_disk(storage, final).read_bytes() == b"bob's final file"
    outside = f"/store/temp/user/alice/{dots}/{dots}/{dots}/{dots}/{uuid.uuid4().hex}"
    _copy(storage, proxy("alice"), outside, source=_https(storage, mine))
    assert not list(export_path(storage, SITE, "/store/x").parents[2].rglob(Path(outside).name))


def test_a_push_reads_nothing_outside_the_export(storage: Config) -> None:
    """Storage round 3, T2: an anonymous COPY push of `/store/../../...tls/host.key` (the
    anonymous client may read /store/, which the path begins with) sent the servers' host key
    to an https receiver of the grid CA. The guard refuses the read; a receiver here, with a
    certificate of that CA, gets nothing."""
    import http.server
    import threading

    received: list[bytes] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # answers curl's `Expect: 100-continue`

        def do_PUT(self) -> None:
            received.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            self.send_response(201)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    files = tls_files(storage)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(files.host_cert, files.host_key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        site_root = export_path(storage, SITE, "/store/x").parents[1]  # <site>/export
        up = "/".join([".."] * len(site_root.parts))
        secret = f"/store/{up}{files.host_key}"
        destination = f"https://localhost:{server.server_address[1]}/leak"
        for plain in (True, False):
            status, body = http_call(storage, ANONYMOUS, "COPY", secret, b"",
                                     {"Destination": destination}, plain=plain)  # fmt: skip
            assert b"success" not in body.lower(), (status, body[:300])
        assert not any(b"PRIVATE KEY" in got for got in received), received
    finally:
        server.shutdown()


# -- who may delete -------------------------------------------------------------------------------
@pytest.mark.parametrize("who", ["anonymous", "bob", "al"])
def test_only_the_owner_and_the_agents_delete_a_temporary_file(storage: Config, who: str) -> None:
    credential = ANONYMOUS if who == "anonymous" else proxy(who)
    stored = write_file(storage, SITE, _temp("alice"), b"alice's")
    assert not root_rm(storage, credential, stored.lfn)
    assert http_call(storage, credential, "DELETE", stored.lfn)[0] in (0, 401, 403)
    assert on_disk(storage, stored.lfn).read_bytes() == b"alice's"
    assert root_rm(storage, proxy("alice"), stored.lfn)
    again = write_file(storage, SITE, _temp("alice"), b"alice's")
    assert http_call(storage, agent(), "DELETE", again.lfn)[0] in (200, 204)
    assert not on_disk(storage, again.lfn).exists()


def test_a_user_may_not_delete_a_final_file_the_agents_may(storage: Config) -> None:
    stored = write_file(storage, SITE, f"/store/user/alice/{uuid.uuid4().hex}.root", b"final")
    assert not root_rm(storage, proxy("alice"), stored.lfn)
    assert http_call(storage, proxy("bob"), "DELETE", stored.lfn)[0] == 403
    assert on_disk(storage, stored.lfn).exists()
    assert root_rm(storage, agent(), stored.lfn)


# -- tokens: the sites take none -----------------------------------------------------------------
def test_no_token_gives_a_client_more_than_an_anonymous_one(storage: Config) -> None:
    """The storage round 2's N1: XrdMacaroons 5.5.3 issued a read-metadata macaroon to anyone;
    a `name:aso-agent-host` caveat appended to it (no key needed) renamed the client for the
    authdb once a stat had passed on the token, and a DELETE (which stats first) then removed
    bob's final file with no credential at all. The sites issue no token and take none: a
    bearer header is a header, and its sender is anonymous."""
    final = f"/store/user/bob/{uuid.uuid4().hex}.root"
    assert root_put(storage, agent(), final, b"bob's final file")
    asked = json.dumps({"caveats": ["activity:READ_METADATA"], "validity": "PT10M"}).encode()
    headers = {"Content-Type": "application/macaroon-request"}
    for who in (ANONYMOUS, proxy("alice")):
        assert http_call(storage, who, "POST", "/store/", asked, headers)[0] != 200
    forged = "MDAxOGxvY2F0aW9uIFQyX0NIX0NFUk4KMDAxZmNpZCBuYW1lOmFzby1hZ2VudC1ob3N0Cg"
    for token in (forged, "name:aso-agent-host", "x" * 2000):
        bearer = {"Authorization": f"Bearer {token}"}
        for plain in (True, False):
            assert http_call(storage, ANONYMOUS, "HEAD", final, b"", bearer, plain=plain)[0] in (
                200, 403)  # fmt: skip
            for method, body in (("DELETE", b""), ("PUT", b"planted")):
                status, _ = http_call(storage, ANONYMOUS, method, final, body, bearer, plain)
                assert status == 403, (token[:20], method, plain, status)
            path = f"{final}.x?authz=Bearer%20{token}"
            assert http_call(storage, ANONYMOUS, "PUT", path, b"x", {}, plain)[0] == 403
    assert on_disk(storage, final).read_bytes() == b"bob's final file"


def _copy(
    storage: Config, credential: Credential, path: str, source: str = "", destination: str = ""
) -> tuple[int, bytes]:
    """A WebDAV COPY at the site: a pull from `source` into `path`, or a push of `path` to
    `destination` (HTTP third-party copy, as gfal2 asks for one)."""
    headers = {"Source": source} if source else {"Destination": destination}
    return http_call(storage, credential, "COPY", path, b"", {**headers, "Overwrite": "T"})


def test_a_third_party_copy_reaches_no_local_file_and_no_plain_http_service(
    storage: Config,
) -> None:
    """The storage round's F1, F2 and F5: XrdHttpTPC 5.5.3 handed a COPY's Source and
    Destination to libcurl as they came: `file:///.../macaroon.secret` was read into alice's
    area (forged macaroons then wrote and deleted in bob's), `Destination: file:///...`
    emptied bob's file and the site's authdb, and `http://127.0.0.1:<store>/` was fetched.
    The servers' curl takes https alone (aso/local/tpc_guard.c, preloaded); the gridmap and
    the authdb are read-only to the servers besides."""
    site_dir = export_path(storage, SITE, "/store/x").parents[2]  # <data_dir>/<site>
    secret = tls_files(storage).host_key  # the servers' own key: theirs to read
    stolen = _temp("alice")
    status, body = _copy(storage, proxy("alice"), stolen, source=f"file://{secret}")
    assert b"success" not in body.lower(), (status, body[:300])
    landed = on_disk(storage, stolen)
    assert not landed.exists() or secret.read_bytes()[:16] not in landed.read_bytes()
    # A push of her own file onto bob's, and onto the site's authdb: neither changes.
    victim, mine = _temp("bob"), _temp("alice")
    assert root_put(storage, proxy("bob"), victim, b"bob's data")
    assert root_put(storage, proxy("alice"), mine, b"hers")
    authdb = (site_dir / "authdb").read_bytes()
    for target in (on_disk(storage, victim), site_dir / "authdb"):
        status, body = _copy(storage, proxy("alice"), mine, destination=f"file://{target}")
        assert b"success" not in body.lower(), (target, status, body[:300])
    assert on_disk(storage, victim).read_bytes() == b"bob's data"
    assert (site_dir / "authdb").read_bytes() == authdb
    assert (site_dir / "authdb").stat().st_mode & 0o222 == 0  # nobody's to write, but ours
    # A plain http:// service on the host (the store, metrics): not fetched.
    fetched = _temp("alice")
    http_url = storage.sites[OTHER].http_url.replace("https://", "http://")
    status, body = _copy(storage, proxy("alice"), fetched, source=f"{http_url}{mine}")
    assert b"success" not in body.lower(), (status, body[:300])
    assert not on_disk(storage, fetched).exists() or on_disk(storage, fetched).read_bytes() == b""


# -- the job's own write, as docs/usage.md shows it: gfal2 with the user's proxy -------------------
JOB = """
import os, sys, tempfile
import gfal2
ctx = gfal2.creat_context()
ctx.set_opt_boolean("HTTP PLUGIN", "RETRIEVE_BEARER_TOKEN", True)
with tempfile.NamedTemporaryFile() as local:
    local.write(b"job output")
    local.flush()
    params = ctx.transfer_parameters()
    params.create_parent = True
    for url in sys.argv[1:]:
        try:
            ctx.filecopy(params, "file://" + local.name, url)
            print("ok", url)
        except gfal2.GError as error:
            print("refused", url, error.code)
"""


def test_a_job_writes_its_output_with_the_user_s_proxy_through_gfal2(storage: Config) -> None:
    root, https = storage.sites[SITE].root_url, storage.sites[SITE].http_url
    own_root, own_davs, bob = _temp("alice"), _temp("alice"), _temp("bob")
    urls = [
        f"{root}/{own_root}",
        f"davs://{urlsplit(https).netloc}{own_davs}",
        f"davs://{urlsplit(https).netloc}{bob}",
    ]
    env = {
        **_client_env(storage, proxy("alice")),
        "SSL_CERT_FILE": str(tls_files(storage).ca_bundle),
    }
    done = subprocess.run(
        [sys.executable, "-c", JOB, *urls], env=env, capture_output=True, text=True, timeout=120
    )
    lines = done.stdout.split("\n")
    assert [line.split()[0] for line in lines if line] == ["ok", "ok", "refused"], done
    assert on_disk(storage, own_root).read_bytes() == b"job output"
    assert on_disk(storage, own_davs).read_bytes() == b"job output"
    assert not on_disk(storage, bob).exists()
