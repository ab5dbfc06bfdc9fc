"""The gfal worker's own bookkeeping, with copies that need no storage: its loop and its copy
threads share the table of running copies, and a busy machine may interleave them anyhow."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import pytest

from aso.agents.gfal_worker import GfalWorker
from aso.config import Config
from aso.store import Server
from aso.transfer import errors
from aso.transfer.base import ACTIVE, CANCELED, DONE, PENDING, FileTransfer, JobRequest
from aso.transfer.gfal_copier import CopyResult, GfalCopier
from aso.transfer.jobstore import FINISHED, RUNNING, JobStore
from tests.pipeline_helpers import wait_for


class QuickCopier:
    """A copier whose copies take `seconds` and succeed: no storage needed."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds
        self.copies = 0

    def precheck(self, entry: Mapping[str, Any], params: Mapping[str, Any]) -> CopyResult | None:
        return None

    def copy(
        self, entry: Mapping[str, Any], params: Mapping[str, Any], cancelled: Callable[[], bool]
    ) -> CopyResult:
        time.sleep(self.seconds)
        self.copies += 1
        return CopyResult(DONE, checksum=entry["adler32"])

    def resume(self, entry: Mapping[str, Any], params: Mapping[str, Any]) -> CopyResult | None:
        return None


class SlowWalk(dict):
    """A table whose walk takes a while, as it does when the loop is descheduled mid-walk on a
    busy machine: copies end meanwhile."""

    def __iter__(self) -> Iterator[Any]:
        for key in super().__iter__():
            yield key
            time.sleep(0.01)


class EagerPool(ThreadPoolExecutor):
    """A pool whose `submit` returns once the task has ended, as it may when the loop is
    descheduled just after handing a quick copy to a thread."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future = super().submit(fn, *args, **kwargs)
        wait([future])
        return future


def job(n: int, files: int) -> JobRequest:
    return JobRequest(
        key=f"race-{n}-{uuid.uuid4()}",
        files=tuple(
            FileTransfer(
                file_id=f"race-{n}-{i}",
                source=f"root://127.0.0.1:1/store/temp/{n}/{i}",
                destination=f"root://127.0.0.1:2/store/user/{n}/{i}",
                size=1,
                adler32="00000001",
            )
            for i in range(files)
        ),
        user="alice",
        task="race",
        source_site="T2_CH_CERN",
        destination_site="T2_DE_DESY",
    )


def job_table(config: Config) -> JobStore:
    """The gfal service's job table, as an agent sees it."""
    return JobStore(
        Server.from_config(config, account="agent").db(config.store.transfers_db), "gfal"
    )


def submit(config: Config, jobs: int, files: int) -> list[str]:
    return job_table(config).create_many([job(n, files) for n in range(jobs)])


def run_jobs(worker: GfalWorker, ids: list[str]) -> dict[str, str]:
    """Run the worker's rounds until the jobs have all finished (or 120 s) and the last
    copies' threads have ended; the jobs' states."""
    table = worker.jobs
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            worker.work_once()
            if all(doc and doc["state"] == FINISHED for doc in table.get_many(ids).values()):
                break
        for _ in range(100):
            if not worker.copies_running():
                break
            time.sleep(0.05)
    finally:
        worker.close()
    return {doc["_id"]: doc["state"] for doc in table.get_many(ids).values() if doc}


def test_copies_ending_while_the_loop_walks_its_table_do_not_stop_it(sim_config: Config) -> None:
    """The loop walks its table of running copies (to renew the leases of jobs still copying)
    while copies end: it goes on, and every job finishes with each file copied once."""
    copier = QuickCopier(seconds=0.02)
    worker = GfalWorker(sim_config, "w-walk", copier=copier)
    worker.running = SlowWalk()
    states = run_jobs(worker, submit(sim_config, jobs=20, files=4))
    assert set(states.values()) == {FINISHED} and len(states) == 20
    assert copier.copies == 80
    assert worker.running == {} and worker.leases == {} and worker.job_locks == {}


def test_a_copy_ending_before_it_is_recorded_as_started_keeps_no_slot(sim_config: Config) -> None:
    """A copy that ends before the loop has recorded it as running is not counted as running
    afterwards: a slot kept by an ended copy is lost until the worker restarts, and a job with
    such a copy is never closed."""
    copier = QuickCopier()
    worker = GfalWorker(sim_config, "w-eager", copier=copier)
    worker.pool.shutdown()
    worker.pool = EagerPool(max_workers=4)
    states = run_jobs(worker, submit(sim_config, jobs=5, files=3))
    assert set(states.values()) == {FINISHED} and len(states) == 5
    assert copier.copies == 15
    assert worker.running == {} and worker.leases == {}


def test_a_restarted_worker_takes_back_its_predecessors_jobs_at_once(sim_config: Config) -> None:
    """A job leased to a worker that died mid-copy (lease far from expiry, one file `active`):
    another worker leaves it until the lease expires; the dead worker's instance started again
    takes it at once, settles the orphaned file and finishes the job, the two runs of that file
    one after the other."""
    copier = QuickCopier()
    table = job_table(sim_config)
    [job_id] = table.create_many([job(0, 3)])
    started = time.time()

    def died_mid_copy(doc: dict[str, Any]) -> bool:
        doc["state"] = RUNNING
        doc["lease"] = {"owner": "w-restart", "until": started + 1000}
        entry = doc["files"]["race-0-0"]
        entry.update(state=ACTIVE, service_state="ACTIVE", started=started)
        entry["runs"] = [{"worker": "w-restart", "start": started, "end": None}]
        return True

    table.update(job_id, died_mid_copy)
    other = GfalWorker(sim_config, "w-other", copier=copier)
    try:
        assert other.work_once()["claimed"] == 0
    finally:
        other.close()
    assert table.get_many([job_id])[job_id]["lease"]["owner"] == "w-restart"

    again = GfalWorker(sim_config, "w-restart", copier=copier)
    states = run_jobs(again, [job_id])
    assert states == {job_id: FINISHED}
    files = table.get_many([job_id])[job_id]["files"]
    assert {entry["state"] for entry in files.values()} == {DONE}
    assert copier.copies == 3
    first, second = files["race-0-0"]["runs"]
    assert first["end"] is not None and first["end"] <= second["start"]


class UntilCancelled(QuickCopier):
    """A copier whose copies run until they are cancelled (long copies under way)."""

    def __init__(self) -> None:
        super().__init__()
        self.started = 0

    def copy(
        self, entry: Mapping[str, Any], params: Mapping[str, Any], cancelled: Callable[[], bool]
    ) -> CopyResult:
        self.started += 1
        while not cancelled():
            time.sleep(0.01)
        return CopyResult(CANCELED, "canceled by the client", errors.CANCELED)


def copying(config: Config, name: str, copies: int) -> GfalWorker:
    """A worker that has taken the submitted jobs, its first `copies` copies under way."""
    slow = UntilCancelled()
    worker = GfalWorker(config, name, copier=slow)
    worker.work_once()
    wait_for(lambda: slow.started >= copies, 30, f"{copies} copies to start")
    return worker


def test_a_worker_stopped_cleanly_hands_its_copies_and_jobs_back(sim_config: Config) -> None:
    """A drained host: its worker stops with copies under way. They are not failed attempts:
    the files are to be copied again (whatever they left at the destination is ours), and the
    jobs' leases end with the worker, so another worker takes them at its next look and
    finishes them."""
    ids = submit(sim_config, jobs=2, files=3)
    table = job_table(sim_config)
    draining = copying(sim_config, "w-drained", 6)
    active = [
        e
        for doc in table.get_many(ids).values()
        for e in doc["files"].values()
        if e["state"] == ACTIVE
    ]
    assert len(active) == 6
    draining.close()
    for doc in table.get_many(ids).values():
        assert doc["lease"] is None and doc["state"] == RUNNING
        for entry in doc["files"].values():
            assert entry["state"] == PENDING and entry["ours"] is True
            [run] = entry["runs"]
            assert run["worker"] == "w-drained" and run["end"] is not None

    copier = QuickCopier()
    successor = GfalWorker(sim_config, "w-next", copier=copier)
    assert successor.work_once()["claimed"] == 2  # at once, not after the lease
    assert run_jobs(successor, ids) == dict.fromkeys(ids, FINISHED)
    assert copier.copies == 6
    for doc in table.get_many(ids).values():
        assert {e["state"] for e in doc["files"].values()} == {DONE}


def test_copies_waiting_on_one_site_leave_slots_for_the_others(sim_config: Config) -> None:
    """Round 29: copies from a site that did not answer held all of a worker's 16 slots; the
    copies between two good sites waited behind them. At most `gfal.per_site` copies from or
    to one site run at once: the others start beside them."""
    import dataclasses

    config = dataclasses.replace(sim_config, gfal=dataclasses.replace(
        sim_config.gfal, workers=6, per_site=4))  # fmt: skip
    stuck = submit(config, jobs=1, files=10)  # T2_CH_CERN → T2_DE_DESY: they never end
    other = dataclasses.replace(job(99, 2), source_site="T2_IT_Pisa", destination_site="T2_US_MIT")
    [elsewhere] = job_table(config).create_many([other])
    slow = UntilCancelled()
    worker = GfalWorker(config, "w-sites", copier=slow)
    try:
        worker.work_once()
        wait_for(lambda: slow.started >= 6, 30, "six copies to start")
        assert worker.running_at("T2_CH_CERN") == 4 and worker.running_at("T2_DE_DESY") == 4
        assert worker.running_at("T2_IT_Pisa") == 2  # the other site's copies go beside them
        assert stuck and elsewhere
        # Once a site's hold holds T2_CH_CERN, the copies hung there count against it alone:
        # T2_DE_DESY's other copies may start (round 30: they had waited 300-490 s).
        from aso.config import HoldsConfig
        from aso.core import holds

        hold = holds.started(None, site="T2_CH_CERN", user="", error_class="timeout",
                             reason="no answer", path="/store/temp/race", needs=0, by="r1",
                             now=time.time(), config=HoldsConfig())  # fmt: skip
        assert hold is not None
        worker.db.put(hold)
        worker.read_held_sites()
        assert worker.held_sites == {"T2_CH_CERN"}
        assert worker.running_at("T2_DE_DESY") == 0 and worker.running_at("T2_CH_CERN") == 4
    finally:
        worker.close()


def test_one_user_s_long_copies_leave_a_site_s_other_slots_to_the_other_users(
    sim_config: Config,
) -> None:
    """Round 35: one user's long copies took every slot of three sites (`gfal.per_site`), and
    another user's small files on a link she never used waited p50 37 s behind them. At most
    `gfal.per_user` copies of one user from or to one site run at once: the other users' go
    beside them, and a job none of whose copies could start is left unclaimed."""
    import dataclasses

    config = dataclasses.replace(sim_config, gfal=dataclasses.replace(
        sim_config.gfal, workers=8, per_site=4, per_user=3))  # fmt: skip
    table = job_table(config)
    hers = table.create_many([job(1, 10), job(2, 10)])  # alice's, CERN → DESY: never end
    slow = UntilCancelled()
    worker = GfalWorker(config, "w-users", copier=slow)
    try:
        worker.work_once()
        wait_for(lambda: slow.started >= 3, 30, "three copies to start")
        assert worker.running_at("T2_CH_CERN", "alice") == 3 == worker.copies_running()
        [claimed] = worker.leases  # her other job could not start: not claimed
        assert claimed in hers
        his = dataclasses.replace(job(3, 4), user="bob", source_site="T2_IT_Pisa")
        [bobs] = table.create_many([his])
        worker.work_once()
        wait_for(lambda: slow.started >= 4, 30, "bob's copy to start")
        # DESY's fourth slot is his: his copy goes beside hers.
        assert worker.running_at("T2_DE_DESY", "bob") == 1 and bobs in worker.leases
        assert worker.running_at("T2_DE_DESY") == 4 and worker.copies_running() == 4
    finally:
        worker.close()


def test_jobs_that_cannot_start_do_not_keep_the_later_ones_of_other_users_waiting(
    sim_config: Config,
) -> None:
    """Round 37: the worker read the 50 oldest queued jobs and passed over those that could
    not start; a user whose running copies had used her share at a site, with 100 one-file jobs
    queued there, kept every later job of every user waiting until her copies ended (bob's 37 s,
    on a link she never used). The worker now looks past them, a longer queue than one round
    looks at over the next rounds, and the users take turns."""
    import dataclasses

    config = dataclasses.replace(sim_config, gfal=dataclasses.replace(
        sim_config.gfal, workers=8, per_site=4, per_user=3))  # fmt: skip
    # Leases that outlast a slow round: a look at 1,100 new jobs on a loaded machine had taken
    # longer than the suite's 2 s worker lease, and her copies stopped with it.
    config = dataclasses.replace(config, transfer=dataclasses.replace(config.transfer, lease=60))
    table = job_table(config)
    table.create_many([job(0, 10)])  # alice's, CERN → DESY: never end
    slow = UntilCancelled()
    worker = GfalWorker(config, "w-turns", copier=slow)
    try:
        worker.work_once()
        wait_for(lambda: slow.started >= 3, 30, "three copies to start")
        queued = 4 * 250 + 100  # more than one round looks at
        table.create_many([job(n, 1) for n in range(1, queued + 1)])
        his = dataclasses.replace(
            job(9999, 2), user="bob", source_site="T2_IT_Pisa", destination_site="T2_US_MIT"
        )
        [bobs] = table.create_many([his])
        # Rounds until his job is claimed (a loaded store's index may show the new jobs over
        # a few of them); never while hers stay queued, before the fix.
        deadline = time.monotonic() + 60
        while bobs not in worker.leases and time.monotonic() < deadline:
            worker.work_once()
        assert bobs in worker.leases, "bob's job not claimed behind her blocked ones"
        wait_for(lambda: worker.running_at("T2_IT_Pisa", "bob") == 2, 30, "bob's copies")
        assert worker.running_at("T2_CH_CERN", "alice") == 3  # hers: still her share alone
        assert len(worker.leases) == 2  # none of her blocked jobs claimed
    finally:
        worker.close()


class FrozenAt:
    """Files whose `reachable` hangs for one site until let go (a frozen storage takes the
    connection and answers nothing), and answers at once for the others."""

    def __init__(self, site: str) -> None:
        self.site, self.thawed = site, threading.Event()

    def reachable(self, url: str) -> str | None:
        if self.site in url and not self.thawed.wait(30):
            return "timeout"
        return None


def test_copies_hung_on_a_site_that_does_not_answer_count_against_it_alone(
    sim_config: Config,
) -> None:
    """Round 31: copies hung on a frozen source do not fail for minutes, so no breaker trips
    and no site's hold tells the worker where they wait: they used up the good destination's
    `gfal.per_site` (its other copies waited p50 115 s). The worker asks the sites of copies
    running past `gfal.stall_after` whether they answer; the one that does not has them
    counted against it alone, until it answers again."""
    import dataclasses

    config = dataclasses.replace(sim_config, gfal=dataclasses.replace(
        sim_config.gfal, workers=6, per_site=4, stall_after=0.3))  # fmt: skip
    assert submit(config, jobs=1, files=10)  # T2_CH_CERN → T2_DE_DESY: they never end
    slow, frozen = UntilCancelled(), FrozenAt("T2_CH_CERN")
    worker = GfalWorker(config, "w-silent", copier=slow, files=frozen)  # type: ignore[arg-type]
    try:
        worker.work_once()
        wait_for(lambda: slow.started >= 4, 30, "four copies to start")
        assert worker.running_at("T2_DE_DESY") == 4 and worker.silent_sites == set()

        def silent() -> bool:
            worker.look_at_stalled_sites()
            return worker.silent_sites == {"T2_CH_CERN"}

        wait_for(silent, 30, "T2_CH_CERN found silent")
        assert worker.running_at("T2_DE_DESY") == 0 and worker.running_at("T2_CH_CERN") == 4
        # Every user's files for it wait held, with why (the submitter keeps them back).
        hold = worker.db.get("hold:T2_CH_CERN")
        assert hold is not None and hold["state"] == "active" and hold["user"] == ""
        assert hold["by"] == "w-silent" and "did not answer within 5 s" in hold["reason"]
        # The hung copies take none of the worker's six slots: four copies between two good
        # sites start beside them (two had before), and no new copy starts at the silent site.
        other = dataclasses.replace(job(98, 4), source_site="T2_IT_Pisa",
                                    destination_site="T2_US_MIT")  # fmt: skip
        job_table(config).create_many([other])
        assert worker.copies_in_use() == 0
        worker.work_once()
        wait_for(lambda: slow.started >= 8, 30, "four more copies to start")
        assert worker.running_at("T2_IT_Pisa") == 4 and worker.running_at("T2_CH_CERN") == 4
        assert worker.copies_running() == 8 and worker.copies_in_use() == 4
        frozen.thawed.set()  # it answers again: its copies count against both ends once more

        def answers() -> bool:
            worker.look_at_stalled_sites()
            return not worker.silent_sites

        wait_for(answers, 30, "T2_CH_CERN answering again")
        assert worker.running_at("T2_DE_DESY") == 4
        released = worker.db.get("hold:T2_CH_CERN")
        assert released is not None and released["state"] == "released"
        assert released["by"] == "w-silent" and "it answers" in released["reason"]
    finally:
        frozen.thawed.set()
        worker.close()


def test_a_user_cancel_is_not_handed_back(sim_config: Config) -> None:
    """A copy cancelled because its owner asked ends `canceled`, stopping worker or not."""
    [job_id] = submit(sim_config, jobs=1, files=1)
    table = job_table(sim_config)
    worker = copying(sim_config, "w-cancel", 1)
    table.request_cancel(job_id, None, time.time())
    wait_for(lambda: not worker.copies_running(), 30, "the cancelled copy to end")
    worker.close()
    [entry] = table.get_many([job_id])[job_id]["files"].values()
    assert entry["state"] == CANCELED and entry["error_class"] == errors.CANCELED


class FlakyChecksums:
    """A gfal2 context whose first `failures` checksum requests fail as XRootD's did."""

    def __init__(self, gfal2: Any, failures: int) -> None:
        self.gfal2, self.failures, self.asked = gfal2, failures, 0

    def checksum(self, url: str, kind: str) -> str:
        self.asked += 1
        if self.asked <= self.failures:
            raise self.gfal2.GError("HTTP 500 : Unexpected server error: 500", 5)
        return "0000abcd"


@pytest.mark.parametrize(("failures", "expected"), [(2, "0000abcd"), (3, None)])
def test_the_destination_checksum_is_asked_again_after_a_server_error(
    tmp_path: Path, failures: int, expected: str | None
) -> None:
    """A storage answering a checksum request with a 500 now and then: asked up to three times,
    the checksum is recorded; three errors in a row record none (the copy was verified by
    gfal2 itself), after three asks."""
    copier = GfalCopier(Config(source=tmp_path / "aso.toml"))
    copier.local.ctx = context = FlakyChecksums(copier.gfal2, failures)
    assert copier.destination_checksum("http://127.0.0.1:1/store/user/f") == expected
    assert context.asked == 3
