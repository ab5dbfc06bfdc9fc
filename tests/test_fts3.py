"""The fts3 back end through the official FTS3 client against the FTS3 double (tests/fts3_double.py)
over HTTPS with client certificates: what is sent, the deterministic ids, the state mapping,
bulk status, cancels, delegation, and how failures of the service come out."""

from __future__ import annotations

import datetime as dt
import logging
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import requests

from aso.config import Config, ConfigError
from aso.local.pki import Pki
from aso.transfer import errors
from aso.transfer.base import (
    ABSENT,
    ACTIVE,
    CANCELED,
    DONE,
    ENDED,
    FAILED,
    JOB_NAMESPACE,
    PENDING,
    FileTransfer,
    JobRefused,
    JobRequest,
    TransferError,
)
from aso.transfer.fts3 import FILE_STATES, Fts3Service
from tests.fts3_double import FILE_STATES as FTS_FILE_STATES
from tests.fts3_double import Fts3Double

SERVICE_FQANS = ["/cms/Role=production/Capability=NULL"]
USER_FQANS = ["/cms/Role=NULL/Capability=NULL"]
# FTS's namespace, copied from fts-rest-flask lib/JobBuilder_utils.py (not from the module).
FTS_BASE_ID = uuid.UUID("urn:uuid:01874efb-4735-4595-bc9c-591aef8240c9")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki.create(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def proxies(pki: Pki) -> dict[str, Path]:
    return {name: pki.proxy_file(pki.user(name)) for name in ("aso-service", "alice", "bob")}


def dn(pki: Pki, name: str) -> str:
    return pki.user(name).dn


def double_for(pki: Pki, **kwargs) -> Fts3Double:
    voms = {
        dn(pki, "aso-service"): SERVICE_FQANS,
        dn(pki, "alice"): USER_FQANS,
        dn(pki, "bob"): USER_FQANS,
    }
    return Fts3Double(pki, voms=voms, **kwargs)


@pytest.fixture
def fts(pki: Pki) -> Iterator[Fts3Double]:
    with double_for(pki) as double:
        yield double


def make_config(tmp_path: Path, pki: Pki, endpoint: str, proxy: Path) -> Config:
    config = Config(source=tmp_path / "aso.toml")
    config.transfer.backend = "fts3"
    config.fts3.endpoint = endpoint
    config.fts3.proxy = str(proxy)
    config.fts3.capath = str(pki.capath)
    config.fts3.timeout = 10.0
    return config


@pytest.fixture
def config(tmp_path: Path, pki: Pki, fts: Fts3Double, proxies: dict[str, Path]) -> Config:
    return make_config(tmp_path, pki, fts.url, proxies["aso-service"])


@pytest.fixture
def service(config: Config) -> Iterator[Fts3Service]:
    svc = Fts3Service(config)
    yield svc
    svc.close()


def transfer(n: int, adler32: str = "1a2b3c4d", size: int = 1048576) -> FileTransfer:
    return FileTransfer(
        file_id=f"req{n:02d}",
        source=f"root://t2-a.example.org:1094//store/temp/user/alice/f{n}.root",
        destination=f"davs://t2-b.example.org:443/dpm/store/user/alice/f{n}.root",
        size=size,
        adler32=adler32,
        metadata={"lfn": f"/store/user/alice/f{n}.root"},
    )


def job_request(proxies: dict[str, Path], key: str = "submitter-1:k1", files: int = 2, **kw):
    fields = dict(
        key=key,
        files=tuple(transfer(n) for n in range(files)),
        user="alice",
        task="240101_120000:alice_crab_test",
        source_site="T2_XX_A",
        destination_site="T2_XX_B",
        credentials=str(proxies["alice"]),
        metadata={"group": "", "role": ""},
    )
    fields.update(kw)
    return JobRequest(**fields)


def fts_id(vo: str, key: str) -> str:
    """FTS's deterministic id as FTS computes it, the sid being ASO's uuid5 of the key."""
    sid = str(uuid.uuid5(JOB_NAMESPACE, key))
    return str(uuid.uuid5(uuid.uuid5(FTS_BASE_ID, vo), sid))


# -- what is submitted ------------------------------------------------------------------------


def test_submission_body(service: Fts3Service, fts: Fts3Double, proxies: dict[str, Path]) -> None:
    request = job_request(proxies, priority=4, max_time_in_queue=7200)
    service.submit(request)

    (post,) = fts.requests_to("POST", "/jobs")
    files, params = post.body["files"], post.body["params"]
    assert [f["sources"] for f in files] == [[t.source] for t in request.files]
    assert [f["destinations"] for f in files] == [[t.destination] for t in request.files]
    assert {f["checksum"] for f in files} == {"ADLER32:1a2b3c4d"}
    assert {f["filesize"] for f in files} == {1048576}
    assert files[1]["metadata"] == {"lfn": "/store/user/alice/f1.root", "request_id": "req01"}
    assert params["verify_checksum"] == "both"
    assert params["overwrite"] is False
    assert params["retry"] == -1  # FTS: 0 is "the server's default", negative is none
    assert params["priority"] == 4
    assert params["max_time_in_queue"] == "7200s"  # a bare integer would mean hours
    assert params["job_metadata"] == {
        "group": "",
        "role": "",
        "issuer": "ASO",
        "user": "alice",
        "task": "240101_120000:alice_crab_test",
        "aso_key": "submitter-1:k1",
    }
    assert params["id_generator"] == "deterministic"
    assert params["sid"] == str(uuid.uuid5(JOB_NAMESPACE, "submitter-1:k1"))


def test_fts_reads_the_job_as_meant(
    service: Fts3Service, fts: Fts3Double, proxies: dict[str, Path]
) -> None:
    before = dt.datetime.now(dt.UTC).timestamp()
    job_id = service.submit(job_request(proxies, priority=9))
    job = fts.jobs[job_id]
    assert job["user_dn"] == dn(fts.pki, "alice")  # submitted with the user's own proxy
    assert job["vo_name"] == "cms"
    assert job["verify_checksum"] == "b"
    assert job["retry"] == -1
    assert job["priority"] == 5  # FTS clamps to 1..5
    # transfer.max_time_in_queue (6 h) as seconds: the expiry is hours away, not years.
    assert before + 21600 - 5 <= job["max_time_in_queue"] <= before + 21600 + 60
    assert job["job_metadata"]["issuer"] == "ASO"
    assert job["job_metadata"]["auth_method"] == "certificate"
    assert [f["file_state"] for f in fts.files[job_id]] == ["SUBMITTED", "SUBMITTED"]


def test_checksum_is_zero_padded(
    service: Fts3Service, fts: Fts3Double, proxies: dict[str, Path]
) -> None:
    request = replace(job_request(proxies), files=(transfer(0, adler32="A1B2C"),))
    job_id = service.submit(request)
    assert fts.files[job_id][0]["checksum"] == "ADLER32:000a1b2c"


def test_overwrite_no_checksum_and_fts_retries(
    config: Config, fts: Fts3Double, proxies: dict[str, Path]
) -> None:
    config.fts3.retry = 2
    service = Fts3Service(config)
    job_id = service.submit(job_request(proxies, overwrite=True, verify_checksum=False))
    job = fts.jobs[job_id]
    assert (job["overwrite_flag"], job["verify_checksum"], job["retry"]) == ("Y", "n", 2)


def test_refused_job(service: Fts3Service, fts: Fts3Double, proxies: dict[str, Path]) -> None:
    bad = FileTransfer("req99", "file:///etc/passwd", "root://t2-b.example.org//store/x", 1, "1")
    with pytest.raises(JobRefused, match="Can not transfer local files"):
        service.submit(replace(job_request(proxies), files=(bad,)))
    assert fts.jobs == {}
    assert [r.status for r in fts.requests_to("POST", "/jobs")] == [400]


# -- deterministic ids ------------------------------------------------------------------------


def test_job_id_is_ftss_deterministic_id(service: Fts3Service, proxies: dict[str, Path]) -> None:
    assert service.submit(job_request(proxies, key="abc")) == fts_id("cms", "abc")


def test_same_key_twice_makes_one_job(
    service: Fts3Service, fts: Fts3Double, proxies: dict[str, Path]
) -> None:
    first = service.submit(job_request(proxies))
    second = service.submit(job_request(proxies))
    assert first == second
    assert list(fts.jobs) == [first]
    assert [r.status for r in fts.requests_to("POST", "/jobs")] == [200, 409]


def test_lookup(
    service: Fts3Service, config: Config, fts: Fts3Double, proxies: dict[str, Path]
) -> None:
    job_id = service.submit(job_request(proxies, key="known"))
    # A new process (restart) with only the service proxy finds the user's job.
    restarted = Fts3Service(config)
    assert restarted.lookup("known") == job_id
    assert restarted.lookup("never-submitted") is None
    fts.forget_job(job_id)
    assert restarted.lookup("known") is None


# -- status -----------------------------------------------------------------------------------

EXPECTED_STATES = {
    "SUBMITTED": PENDING,
    "READY": PENDING,
    "ACTIVE": ACTIVE,
    "FINISHED": DONE,
    "FAILED": FAILED,
    "CANCELED": CANCELED,
    "NOT_USED": PENDING,
    "STAGING": PENDING,
    "STARTED": ACTIVE,
    "ARCHIVING": ACTIVE,
    "QOS_TRANSITION": ACTIVE,
    "QOS_REQUEST_SUBMITTED": ACTIVE,
    "ON_HOLD": PENDING,
    "ON_HOLD_STAGING": PENDING,
    "TOKEN_PREP": PENDING,
    "DELETE": PENDING,
    "FORCE_START": PENDING,
}


def test_every_fts_file_state_is_mapped(
    service: Fts3Service, fts: Fts3Double, proxies: dict[str, Path]
) -> None:
    assert set(FTS_FILE_STATES) <= set(FILE_STATES) == set(EXPECTED_STATES)
    states = sorted(EXPECTED_STATES)
    job_id = service.submit(job_request(proxies, files=len(states)))
    for n, state in enumerate(states):
        fts.set_file_state(job_id, n, state, reason="x" if state == "FAILED" else None)

    job = service.status([job_id])[job_id]
    assert job is not None
    seen = {f.service_state: f.state for f in job.files.values()}
    assert len(seen) == len(states)
    assert seen == EXPECTED_STATES
    assert job.key == "submitter-1:k1"
    assert not job.terminal


def test_file_status_details(
    service: Fts3Service, fts: Fts3Double, proxies: dict[str, Path]
) -> None:
    job_id = service.submit(job_request(proxies, files=3))
    start = dt.datetime(2024, 5, 1, 12, 0, 0, tzinfo=dt.UTC)
    end = start + dt.timedelta(seconds=95)
    fts.set_file_state(job_id, 0, "FINISHED", start_time=start, finish_time=end)
    reason = "SOURCE [2] Result HTTP 404 : File not found  after 1 attempts"
    fts.set_file_state(job_id, 1, "FAILED", reason=reason)
    fts.set_file_state(job_id, 2, "ACTIVE")

    files = service.status([job_id])[job_id].files
    done, failed, active = files["req00"], files["req01"], files["req02"]
    assert (done.state, done.checksum, done.started, done.ended) == (
        DONE,
        "1a2b3c4d",
        start.timestamp(),
        end.timestamp(),
    )
    assert (done.reason, done.error_class) == (None, None)
    assert (failed.state, failed.reason) == (FAILED, reason)
    assert failed.error_class == errors.SOURCE_MISSING
    assert failed.ended is not None and failed.checksum is None
    assert (active.state, active.ended) == (ACTIVE, None)
    assert active.started is not None


def test_bulk_status_is_one_request(
    service: Fts3Service, fts: Fts3Double, proxies: dict[str, Path]
) -> None:
    ids = [service.submit(job_request(proxies, key=f"bulk-{n}", files=1)) for n in range(3)]
    fts.set_file_state(ids[1], 0, "FINISHED")
    fts.requests.clear()

    statuses = service.status(ids)

    assert [r.path for r in fts.requests_to("GET", "/jobs.*")] == ["/jobs/" + ",".join(ids)]
    assert [statuses[i].files["req00"].state for i in ids] == [PENDING, DONE, PENDING]
    assert [statuses[i].key for i in ids] == ["bulk-0", "bulk-1", "bulk-2"]


def test_status_of_jobs_fts_does_not_know(
    service: Fts3Service, fts: Fts3Double, proxies: dict[str, Path]
) -> None:
    known = service.submit(job_request(proxies, files=1))
    gone = str(uuid.uuid4())
    result = service.status([known, gone])  # FTS answers 207 Multi-Status
    assert result[gone] is None and result[known] is not None
    assert service.status([gone]) == {gone: None}  # one job: 404
    other = str(uuid.uuid4())
    assert service.status([gone, other]) == {gone: None, other: None}  # 207, none found
    assert service.status([]) == {}


def test_status_of_a_job_not_ours_to_see(
    tmp_path: Path, pki: Pki, proxies: dict[str, Path]
) -> None:
    # The service proxy with FTS's "private" level only sees its own jobs: 403 for alice's.
    with double_for(pki, levels={dn(pki, "aso-service"): "private"}) as fts:
        service = Fts3Service(make_config(tmp_path, pki, fts.url, proxies["aso-service"]))
        job_id = service.submit(job_request(proxies))
        own = service.submit(job_request(proxies, key="own", credentials=None))
        assert service.status([own])[own] is not None
        with pytest.raises(TransferError, match="403 Forbidden"):  # in a 207 answer
            service.status([own, job_id])
        with pytest.raises(TransferError, match="Unauthorized: Not enough permissions"):
            service.status([job_id])
        with pytest.raises(TransferError, match="Unauthorized: Not enough permissions"):
            service.status([job_id, str(uuid.uuid4())])  # 207 without any job: one by one


# -- cancel -----------------------------------------------------------------------------------


def test_cancel_job(service: Fts3Service, fts: Fts3Double, proxies: dict[str, Path]) -> None:
    job_id = service.submit(job_request(proxies))
    fts.set_file_state(job_id, 0, "ACTIVE")

    service.cancel(job_id)

    assert [r.path for r in fts.requests_to("DELETE")] == [f"/jobs/{job_id}"]
    files = service.status([job_id])[job_id].files
    assert {f.state for f in files.values()} == {CANCELED}
    assert {f.error_class for f in files.values()} == {errors.CANCELED}
    service.cancel(job_id)  # again: FTS answers 304 inside a 200, nothing raised


def test_cancel_some_files(service: Fts3Service, fts: Fts3Double, proxies: dict[str, Path]) -> None:
    job_id = service.submit(job_request(proxies, files=3))

    service.cancel(job_id, ["req00", "req02", "not-in-job"])

    fts_ids = [fts.file(job_id, n)["file_id"] for n in (0, 2)]
    (delete,) = fts.requests_to("DELETE")
    assert delete.path == f"/jobs/{job_id}/files/{fts_ids[0]},{fts_ids[1]}"
    files = service.status([job_id])[job_id].files
    assert [files[f].state for f in ("req00", "req01", "req02")] == [CANCELED, PENDING, CANCELED]


def test_cancel_of_unknown_job_is_no_error(
    service: Fts3Service, fts: Fts3Double, caplog: pytest.LogCaptureFixture
) -> None:
    unknown = str(uuid.uuid4())
    with caplog.at_level(logging.WARNING, logger="aso.transfer.fts3"):
        service.cancel(unknown)
        service.cancel(unknown, ["req00"])
    assert [r.status for r in fts.requests if r.path.startswith("/jobs")] == [404, 404]
    assert caplog.text.count("nothing to cancel") == 2


def test_fence_cancels_what_runs_and_confirms_it(
    service: Fts3Service, fts: Fts3Double, proxies: dict[str, Path]
) -> None:
    """TransferService.fence on FTS3: a file still at work is cancelled by the job's
    deterministic id and the fence holds only once FTS reports it ended; a file already
    ended is left as it is; a job FTS answers 404 for is absent."""
    job_id = service.submit(job_request(proxies, files=3))
    fts.set_file_state(job_id, 0, "ACTIVE")
    fts.set_file_state(job_id, 1, "FINISHED")

    fence = service.fence(job_id, ["req00", "req01"])

    assert fence is not None and fence.verdict == ENDED, fence
    fts_id0 = fts.file(job_id, 0)["file_id"]
    assert [r.path for r in fts.requests_to("DELETE")] == [f"/jobs/{job_id}/files/{fts_id0}"]
    files = service.status([job_id])[job_id].files
    assert [files[f].state for f in ("req00", "req01", "req02")] == [CANCELED, DONE, PENDING]
    unknown = fts_id("atlas", "submitter-1:never-submitted")
    absent = service.fence(unknown, ["req00"])
    assert absent is not None and absent.verdict == ABSENT


def test_fence_waits_while_fts_does_not_answer(
    service: Fts3Service, fts: Fts3Double, proxies: dict[str, Path]
) -> None:
    """An FTS that cannot say whether the job runs, or cannot cancel it: TransferError (the
    file waits), never a guess; later the fence holds."""
    job_id = service.submit(job_request(proxies, files=1))
    fts.set_file_state(job_id, 0, "ACTIVE")
    fts.fail_next(503, method="GET", path="/jobs/.*")
    with pytest.raises(TransferError, match="503"):
        service.fence(job_id, ["req00"])
    fts.fail_next(503, method="DELETE")
    with pytest.raises(TransferError):
        service.fence(job_id, ["req00"])
    fence = service.fence(job_id, ["req00"])
    assert fence is not None and fence.verdict == ENDED
    assert service.status([job_id])[job_id].files["req00"].state == CANCELED


# -- delegation -------------------------------------------------------------------------------


def test_delegates_once(service: Fts3Service, fts: Fts3Double, proxies: dict[str, Path]) -> None:
    service.submit(job_request(proxies, key="d1"))
    service.submit(job_request(proxies, key="d2"))

    puts = fts.requests_to("PUT", "/delegation/.*/credential")
    assert [(p.dn, p.status) for p in puts] == [(dn(fts.pki, "alice"), 201)]
    (credential,) = fts.delegations.values()
    assert credential["dn"] == dn(fts.pki, "alice")
    assert len(fts.jobs) == 2


def test_delegates_again_when_fts_delegation_expired(
    service: Fts3Service, fts: Fts3Double, proxies: dict[str, Path]
) -> None:
    service.submit(job_request(proxies, key="e1"))
    fts.expire_delegation(dn(fts.pki, "alice"))
    service.submit(job_request(proxies, key="e2"))
    assert len(fts.requests_to("PUT", "/delegation/.*/credential")) == 2
    assert len(fts.jobs) == 2


def test_job_without_credentials_uses_the_configured_proxy(
    service: Fts3Service, fts: Fts3Double, proxies: dict[str, Path]
) -> None:
    job_id = service.submit(job_request(proxies, credentials=None))
    assert fts.jobs[job_id]["user_dn"] == dn(fts.pki, "aso-service")


def test_renewed_proxy_gets_a_new_context(
    service: Fts3Service, fts: Fts3Double, pki: Pki, proxies: dict[str, Path]
) -> None:
    path = pki.proxy_file(pki.user("bob"), tag="-renewed")
    service.submit(job_request(proxies, key="r1", credentials=str(path)))
    service.submit(job_request(proxies, key="r2", credentials=str(path)))
    assert len(fts.requests_to("GET", "/")) == 1  # the Context is kept while the file is
    pki.proxy_file(pki.user("bob"), tag="-renewed")  # voms-proxy-init again
    service.submit(job_request(proxies, key="r3", credentials=str(path)))
    assert len(fts.requests_to("GET", "/")) == 2


# -- failures ---------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [401, 403])
def test_submit_refused_credentials(
    service: Fts3Service, fts: Fts3Double, proxies: dict[str, Path], code: int
) -> None:
    fts.fail_next(code, method="POST", path="/jobs", message="Not allowed to submit")
    with pytest.raises(TransferError, match="Unauthorized: Not allowed to submit") as caught:
        service.submit(job_request(proxies))
    assert not isinstance(caught.value, JobRefused)
    assert caught.value.error_class == errors.SERVICE
    assert fts.jobs == {}


def test_delegation_refused(
    service: Fts3Service, fts: Fts3Double, proxies: dict[str, Path]
) -> None:
    fts.fail_next(403, path="/whoami")
    with pytest.raises(TransferError, match="cannot delegate the proxy: Unauthorized") as caught:
        service.submit(job_request(proxies))
    assert not isinstance(caught.value, JobRefused)
    assert fts.requests_to("POST", "/jobs") == []


@pytest.mark.parametrize("code", [500, 503])
def test_server_errors_are_transient(
    service: Fts3Service, fts: Fts3Double, proxies: dict[str, Path], code: int
) -> None:
    fts.fail_next(code, method="POST", path="/jobs")
    with pytest.raises(TransferError, match=str(code)):
        service.submit(job_request(proxies))
    job_id = service.submit(job_request(proxies))  # later: it works, and only once
    assert list(fts.jobs) == [job_id]

    fts.fail_next(code, method="GET", path="/jobs/.*")
    with pytest.raises(TransferError, match=str(code)) as caught:
        service.status([job_id])
    assert caught.value.error_class == errors.SERVICE
    fts.fail_next(code, method="DELETE")
    with pytest.raises(TransferError):
        service.cancel(job_id)
    assert service.status([job_id])[job_id] is not None


def test_unreachable_service(tmp_path: Path, pki: Pki, proxies: dict[str, Path]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = make_config(tmp_path, pki, f"https://127.0.0.1:{port}", proxies["aso-service"])
    service = Fts3Service(config)
    for call in (lambda: service.status(["x"]), lambda: service.submit(job_request(proxies))):
        with pytest.raises(TransferError, match=r"Connection refused|Max retries") as caught:
            call()
        assert caught.value.error_class == errors.SERVICE


def test_missing_proxy(config: Config, proxies: dict[str, Path], tmp_path: Path) -> None:
    config.fts3.proxy = str(tmp_path / "no-such-proxy")
    with pytest.raises(TransferError, match="no-such-proxy"):
        Fts3Service(config).lookup("k")


def test_endpoint_is_required(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"fts3\.endpoint"):
        Fts3Service(Config(source=tmp_path / "aso.toml"))


def test_monitor_link(config: Config) -> None:
    config.fts3.monitor_url = "https://fts3.example.org:8449/fts3/ftsmon/#/job/{job_id}"
    assert Fts3Service(config).monitor_link("abc") == (
        "https://fts3.example.org:8449/fts3/ftsmon/#/job/abc"
    )


def test_double_demands_a_trusted_client_certificate(fts: Fts3Double, pki: Pki) -> None:
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(fts.url + "/whoami", verify=str(pki.ca_file), timeout=10)
    # The double's thread counts the refused handshake after the client has given up: wait.
    deadline = time.monotonic() + 10
    while fts.refused_connections < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fts.refused_connections >= 1
    assert fts.requests == []
