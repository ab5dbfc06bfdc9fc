"""A real three-node Apache CouchDB cluster on loopback, as `aso store start --nodes 3` runs it,
and what changes for ASO on a cluster (aso/store/, the CLUSTER_ quirks).

CouchDB only: a cluster is CouchDB's (pouchdb-server is one process); `make test` runs this
module in its CouchDB leg.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from aso import model, reconcile
from aso.config import Config
from aso.local.couchdb import CouchDBCluster, node_url
from aso.local.managed import local_store
from aso.local.stores import free_ports
from aso.model import AGENT, CLEANUP, STATE, Change
from aso.monitoring import purge
from aso.store import Contested, Server, Settings
from aso.transfer.base import ABSENT, CANCELED, FileTransfer, JobRequest, job_id_for
from aso.transfer.sim import SimService
from tests.conftest import db_as, make_config, only_on, sample_request, write_config
from tests.test_store import conflicted

pytestmark = only_on("couchdb", "a cluster of nodes is CouchDB's")
ASO = str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "aso")


def aso(*args: str, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ASO, "--config", str(config), *args], capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Config, Path]]:
    """Three nodes started through the CLI (`aso store start --nodes 3`), databases made by
    `aso db init`; stopped through the CLI at the end."""
    tmp = tmp_path_factory.mktemp("cluster")
    config = make_config(tmp, free_ports(3))
    path = write_config(config)
    started = aso("store", "start", "--nodes", "3", config=path)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert started.stdout.count("started (pid") == 3, started.stdout
        assert "cluster of 3 nodes finished" in started.stdout
        init = aso("db", "init", config=path)
        assert init.returncode == 0, init.stderr
        yield config, path
    finally:
        stopped = aso("store", "stop", config=path)
    assert stopped.stdout.count("stopped (pid") == 3, stopped.stdout + stopped.stderr


def node_admin(config: Config, index: int) -> Server:
    url = node_url(config.store.url, index)
    return Server(url, config.store.admin_user, config.store.admin_password, Settings(retries=1))


def test_the_cluster_answers_on_every_node_and_passes_the_check(cluster):
    config, path = cluster
    status = aso("store", "status", config=path)
    assert status.returncode == 0, status.stdout
    for index in (1, 2, 3):
        assert f"node{index} {node_url(config.store.url, index)}: answering" in status.stdout
    report = json.loads(aso("store", "check", "--json", config=path).stdout)
    assert report["ok"] is True and report["counts"]["error"] == 0, report["findings"]
    details = {f["item"]: f["detail"] for f in report["findings"]}
    assert details["cluster"].startswith("3 nodes, all connected")
    names = json.loads((config.path(config.embedded.data_dir) / "couchdb/store.json").read_text())
    for name in names["names"]:
        assert name in details["cluster"]
        assert f"{name}: attachments CSP" in details  # every node's settings are checked
    assert details[f"database {config.store.files_db}"].startswith("q=8, n=3")
    assert details[f"database {config.store.stats_db}"].startswith("q=2, n=3")
    # Joining again (as deploy/ does it) finds nothing to do.
    again = aso("store", "setup-cluster", *names["names"][1:], config=path)
    assert again.returncode == 0 and "added node" not in again.stdout, again.stdout
    assert all(name in again.stdout for name in names["names"])
    # A store made with 3 nodes is not started as one.
    refused = aso("store", "start", "--nodes", "1", config=path)
    assert refused.returncode == 1 and "has 3 node(s)" in refused.stderr


def test_every_node_serves_the_same_documents(cluster):
    config, _ = cluster
    db = config.store.files_db
    doc = sample_request("alice")
    node_admin(config, 2).db(db).create(doc)
    for index in (1, 2, 3):
        assert node_admin(config, index).db(db).get(doc["_id"])["source_lfn"] == doc["source_lfn"]


def test_below_the_quorum_a_write_is_contested_and_kept(cluster):
    """CLUSTER_ACCEPTED_IS_NOT_WON: with two of three nodes down, a write reaches one copy
    (HTTP 202): the writer is told it may not have won (a Conflict: agents do not act on it),
    and since no other branch beats it, it is not withdrawn: the document keeps it."""
    config, path = cluster
    store = local_store(config)
    assert isinstance(store, CouchDBCluster)
    db = node_admin(config, 1).db(config.store.files_db)
    doc = sample_request("alice")
    doc["_rev"] = db.create(doc)
    other = sample_request("alice")
    other["_rev"] = db.create(other)
    for index in (2, 3):
        assert store.node(index).kill()
    try:
        moved = model.transition(doc, [Change(STATE, "submitted", "sub-1")], AGENT)
        with pytest.raises(Contested):
            db.put(moved)
        moved_too = model.transition(other, [Change(STATE, "submitted", "s")], AGENT)
        [result] = db.bulk_write([moved_too])
        assert not result.ok and result.conflict and result.accepted and result.rev
        assert db.get(doc["_id"])[STATE] == "submitted"  # kept: nothing beats it
        assert db.get(other["_id"])["_rev"] == result.rev
    finally:
        for index in (2, 3):
            store.node(index).start()
    assert aso("store", "status", config=path).returncode == 0


def test_a_purge_withdraws_the_conflicting_branches_of_what_it_deletes(files_db, accounts):
    """CLUSTER_CONFLICTING_BRANCHES: deleting a request's winning revision would make a
    conflicting branch the document again (here an unfinished `submitted`); the purge withdraws
    the branches with it."""
    agent = db_as(accounts, "agent", files_db)
    doc, _, low = conflicted(files_db, accounts, "1" * 32)
    winner = agent.get(doc["_id"])
    # Failed, its temporary copy discarded: finished (model.is_final).
    ended = [Change(STATE, "failed", "operator"), Change(CLEANUP, "cleaned", "operator")]
    final = model.transition(winner, ended, model.ADMIN)
    final["_rev"] = db_as(accounts, "admin", files_db).put(final)
    assert agent.get_many([doc["_id"]], conflicts=True)[doc["_id"]]["_conflicts"] == [low]
    batch = {"requests": {doc["_id"]: {"rev": final["_rev"], "created": final["created"]}}}
    purge.delete(agent, batch)
    assert agent.get(doc["_id"]) is None  # no branch came back
    assert agent.leaves(doc["_id"]) == []


def test_the_reconciler_keeps_the_winner_of_a_quiet_conflict(
    files_db, accounts, store_config, tmp_path
):
    """A conflict neither writer withdrew (each saw only its own branch) is reported once it
    has been quiet for twice the lease, and `aso reconcile --kind conflict --fix` keeps
    CouchDB's winner, withdrawing the other branch as an agent."""
    agent = db_as(accounts, "agent", files_db)
    doc, high, low = conflicted(files_db, accounts, "2" * 32)
    requests = [r for r in reconcile.scan_requests(agent) if r.id == doc["_id"]]
    assert requests[0].conflicts == (low,)
    lease = store_config.transfer.lease
    assert not reconcile.find_conflicts(requests, requests[0].last_update + lease, 2 * lease)
    config = dataclasses.replace(
        store_config,
        source=tmp_path / "aso.toml",
        store=dataclasses.replace(store_config.store, files_db=files_db),
        transfer=dataclasses.replace(store_config.transfer, backend="sim", lease=1.0),
    )
    path = write_config(config)
    time.sleep(2.5)  # quiet for twice the (one-second) lease
    run = aso("reconcile", "--kind", "conflict", "--fix", "--json", config=path)
    answer = json.loads(run.stdout)
    ours = [f for f in answer["fixes"] if f["finding"]["request_id"] == doc["_id"]]
    assert ours and ours[0]["repaired"] and "withdrew 1 " in ours[0]["text"], answer
    assert [d["_rev"] for d in agent.leaves(doc["_id"])] == [high]
    assert agent.get(doc["_id"])["history"][-1]["by"] == "sub-1"


def test_a_job_stored_below_the_quorum_is_fenced_and_cancelled_when_it_comes_back(cluster):
    """The case of issue 34: a job written while two nodes were down reaches one node only;
    that node dies. The other two know no such job, so the monitor's fence stands at the
    job's id, written at the quorum (a release may follow: nothing can run the old job from
    then on). When the node comes back with the job, the job is a branch beside the fence,
    and every reader sees every file of it cancelled from the fence's time: its copies end
    there, before any new attempt."""
    config, path = cluster
    store = local_store(config)
    assert isinstance(store, CouchDBCluster)
    sim = dataclasses.replace(config.sim, mean_duration=600.0, distribution="fixed")
    key = f"sub-1:{uuid.uuid4()}"
    job = JobRequest(
        key=key,
        files=tuple(
            FileTransfer(f"f{n}", "sim://a/x", "sim://b/x", 1, "00000001") for n in range(3)
        ),
        user="alice",
        task="240101_120000:alice_t",
        source_site="T2_XX_A",
        destination_site="T2_XX_B",
    )
    services = {
        i: SimService(node_admin(config, i).db(config.store.transfers_db), sim) for i in (1, 2)
    }
    for index in (2, 3):
        assert store.node(index).kill()
    try:
        services[1].submit(job)  # stored by node 1 alone (202: reported as "exists")
        assert store.node(1).kill()
    finally:
        for index in (2, 3):
            store.node(index).start()
    job_id = job_id_for(key)
    try:
        assert services[2].lookup(key) is None and services[2].status([job_id]) == {job_id: None}
        fence = services[2].fence(job_id, ["f0", "f1", "f2"])
        assert fence is not None and fence.verdict == ABSENT, fence
        fenced_at = services[2].jobs.db.get(job_id)["fenced"]
    finally:
        store.node(1).start()
    db = node_admin(config, 2).db(config.store.transfers_db)
    deadline = time.time() + 120
    while len(db.leaves(job_id)) < 2 and time.time() < deadline:
        time.sleep(1)  # internal replication brings node 1's job back
    assert len(db.leaves(job_id)) == 2
    merged = services[2].jobs.get(job_id)
    assert merged is not None and set(merged["files"]) == {"f0", "f1", "f2"}
    assert merged["cancel"] == dict.fromkeys(merged["files"], fenced_at)
    runs = services[2].copies(merged)
    assert all(end <= fenced_at for _, end in runs.values()), runs
    status = services[2].status([job_id])[job_id]
    assert status is not None and {f.state for f in status.files.values()} == {CANCELED}
    # Followed through node 1 too: the same job, the same cancels.
    assert services[1].jobs.get(job_id)["cancel"] == merged["cancel"]
    assert aso("store", "status", config=path).returncode == 0


@pytest.mark.timeout(900)  # a subprocess bounded by its own timeout and --drain-timeout
@pytest.mark.parametrize(
    ("lease", "nodes_killed", "seed"),
    [("20s", ("2",), "1"), ("10s", ("2", "3"), "42")],
    ids=["node-2-lease-20s", "nodes-2-then-3-lease-10s"],
)
def test_a_lifecycle_run_with_nodes_killed_accounts_for_every_file(
    tmp_path, lease, nodes_killed, seed
):
    """`aso sim` on a cluster of its own: agents on three hosts, each talking to its own node,
    while files are injected; nodes are killed with SIGKILL (one after the other) and started
    again. Every file ends exactly once, none is copied twice at once, no lease is left hanging
    (every file is final; an acquisition the restarted node stored below the quorum is settled
    when its lease ends), every job not found was fenced before its files went on (issue 34:
    the lease is when to look, the fence what makes it safe), and every published file is in
    the catalog exactly once (exit 0 only then)."""
    workdir = tmp_path / "sim"
    kills = [arg for index in nodes_killed for arg in ("--kill-node", index)]
    run = subprocess.run(
        [ASO, "sim", "--scale", "2", "--users", "10", "--sites", "4", "--interval", "2s",
         "--duration", "40s", "--mean-duration", "2", "--failure-rate", "0.1",
         "--retry-delay", "1", "--block-timeout", "3", "--engine", "couchdb", "--nodes", "3",
         "--hosts", "3", *kills, "--no-ceiling", "--no-progress", "--json", "--seed", seed,
         "--lease", lease, "--drain-timeout", "240", "--workdir", str(workdir)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(run.stdout)
    accounting = report["accounting"]
    assert accounting["exact"] and accounting["copied_twice_at_once"] == [], accounting
    assert accounting["unfenced"] == [], accounting
    assert accounting["injected"] == sum(accounting["outcomes"].values()) > 50
    assert report["chaos"]["nodes_restarted"] == len(nodes_killed)
    events = [(e["what"], e["target"]) for e in report["chaos"]["events"]]
    assert events == [
        (what, f"node{index}") for index in nodes_killed for what in ("node_down", "node_up")
    ], events
    first = store_url(workdir / "aso.toml")
    for index, host in enumerate(("sim", "sim2", "sim3"), start=1):
        assert store_url(workdir / f"aso-{host}.toml") == node_url(first, index)


def test_sim_refuses_nodes_without_couchdb(tmp_path):
    for args, words in ((["--nodes", "3"], "--nodes needs --engine couchdb"),
                        (["--engine", "couchdb", "--nodes", "2", "--kill-node", "3"],
                         "--kill-node must be a node 1..2"),
                        (["--lease", "0s"], "'0s' is not a duration")):  # fmt: skip
        run = subprocess.run([ASO, "sim", *args, "--workdir", str(tmp_path)], capture_output=True,
                             text=True, timeout=60)  # fmt: skip
        assert run.returncode == 2 and words in run.stderr, run.stderr


def store_url(config_file: Path) -> str:
    text = config_file.read_text()
    return next(line.split('"')[1] for line in text.splitlines() if line.startswith("url = "))
