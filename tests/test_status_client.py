"""A client of the status API written from docs/status-api.md alone, as a CRAB-style integrator
would: it imports nothing from ASO (HTTP with `requests` and the standard library), records a
task of 1,000 files, pages through it, and follows it by the store's sequence while the agents
copy and clean the files, on both stores. Every file's final state must reach it exactly once.
The fixtures give it what a user would be given: the store's address, an account, the files
database's name and the catalogue's site names."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import requests

FILES = 1000
PAGE = 100
TASK = "261125_100000:alice_client"
FINAL = {"state": {"done", "failed", "killed"}, "cleanup": {"cleaned", "not_needed"},
         "publication": {"published", "publication_failed", "not_required"}}  # fmt: skip


class Client:
    """docs/status-api.md, section by section."""

    def __init__(self, url: str, user: str, password: str, db: str):
        self.http = requests.Session()
        self.http.auth = (user, password)
        self.base = f"{url}/{db}"
        self.views = f"{self.base}/_design/asyncstageout/_view"

    def get(self, url: str, **params: Any) -> Any:
        answer = self.http.get(url, params=params, timeout=60)
        answer.raise_for_status()
        return answer.json()

    def post(self, url: str, body: Any, **params: Any) -> requests.Response:
        return self.http.post(url, json=body, params=params, timeout=60)

    # -- Recording a request --------------------------------------------------------------------
    def request(self, job: int, source: str, destination: str, size: int = 1000) -> dict[str, Any]:
        source_lfn = f"/store/temp/user/alice/client/{TASK.split(':')[0]}/out_{job}.root"
        now = time.time()
        return {
            "_id": hashlib.sha256(source_lfn.encode()).hexdigest(),
            "type": "transfer_request", "schema": 1, "user": "alice", "task": TASK,
            "job_id": str(job), "job_retry": 0, "file_type": "output",
            "source": source, "destination": destination, "source_lfn": source_lfn,
            "destination_lfn": source_lfn.replace("/store/temp/user/", "/store/user/"),
            "size": size, "checksum": {"adler32": "0a1b2c3d"}, "publish": False,
            "state": "new", "cleanup": "pending", "publication": "not_required",
            "created": now, "last_update": now,
            "history": [{"axis": "state", "from": None, "to": "new", "at": now, "by": "alice"}],
        }  # fmt: skip

    def record(self, docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        answer = self.post(f"{self.base}/_bulk_docs", {"docs": docs})
        assert answer.status_code in (201, 202), answer.text
        return list(answer.json())

    def same_file(self, doc: dict[str, Any]) -> bool:
        """After a 409: is the stored request this file?"""
        stored = self.get(f"{self.base}/{doc['_id']}")
        fields = ("source_lfn", "destination_lfn", "source", "destination", "size", "checksum")
        return all(stored[f] == doc[f] for f in fields)

    # -- Reading a task -------------------------------------------------------------------------
    def rows(self, task: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        params: dict[str, Any] = {"start_key": f'["{task}"]', "end_key": f'["{task}",{{}}]'}
        while True:
            page = self.get(f"{self.views}/by_task", limit=PAGE, **params)["rows"]
            rows += page
            if len(page) < PAGE:
                return rows
            params.update(start_key=_json_key(page[-1]["key"]), skip=1)

    def size(self, task: str) -> int:
        got = self.get(f"{self.views}/task_states", start_key=f'["{task}","state"]',
                       end_key=f'["{task}","state",{{}}]', group_level=2)["rows"]  # fmt: skip
        return int(got[0]["value"]) if got else 0


def _json_key(key: list[Any]) -> str:
    return json.dumps(key)


class Follower:
    """docs/status-api.md, "Following a task"."""

    def __init__(self, client: Client, task: str):
        self.client, self.task = client, task
        self.known: dict[str, dict[str, Any]] = {}  # id → its last row
        self.seen: list[dict[str, Any]] = []  # every row received, in order

    def start(self) -> None:
        self.seq = self.client.get(self.client.base)["update_seq"]
        self._take(self.client.rows(self.task))

    def poll(self) -> None:
        changes = self.client.post(f"{self.client.base}/_changes", {"doc_ids": sorted(self.known)},
                                   filter="_doc_ids", since=self.seq)  # fmt: skip
        assert changes.status_code == 200, changes.text
        answer = changes.json()
        changed = {c["id"] for c in answer["results"]}
        rows = []
        if self.client.size(self.task) != len(self.known):
            rows = [r for r in self.client.rows(self.task)
                    if r["id"] in changed or r["id"] not in self.known]  # fmt: skip
        elif changed:
            keys = [self.known[i]["key"] for i in sorted(changed)]
            got = self.client.post(f"{self.client.views}/by_task", {"keys": keys})
            assert got.status_code == 200, got.text
            rows = got.json()["rows"]
        self._take(rows)
        self.seq = answer["last_seq"]

    def _take(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            last = self.known.get(row["id"])
            if last is not None and last["value"]["rev"] == row["value"]["rev"]:
                continue  # read at its newest before: the same state again
            self.known[row["id"]] = row
            self.seen.append(row)

    def finished(self) -> bool:
        return len(self.known) == FILES and all(
            all(r["value"][axis] in ends for axis, ends in FINAL.items())
            for r in self.known.values()
        )


def test_a_client_from_the_docs_records_pages_and_follows_a_task(
    sim_config, accounts, agents_in_background
):
    alice = accounts["alice"]
    client = Client(alice.url, alice.user, alice._password, sim_config.store.files_db)
    sites = sorted(sim_config.sites)
    links = [(sites[i], sites[-1 - i]) for i in range(3)]
    docs = [client.request(job, *links[job % 3]) for job in range(1, FILES + 1)]
    # The first half is recorded before the client starts following, the rest while it does
    # (a task grows while its jobs end).
    for start in range(0, FILES // 2, 250):
        assert all("rev" in r for r in client.record(docs[start : start + 250]))

    follower = Follower(client, TASK)
    follower.start()
    rows = client.rows(TASK)
    assert len(rows) == FILES // 2 and len({r["id"] for r in rows}) == FILES // 2
    jobs = [int(r["value"]["job_id"]) for r in rows]
    assert jobs == sorted(jobs)  # numeric job order, across pages of 100

    for start in range(FILES // 2, FILES, 250):
        client.record(docs[start : start + 250])
        follower.poll()
    # Recording the same file again: 409, and the stored request is that file.
    again = client.record(docs[:3])
    assert [r.get("error") for r in again] == ["conflict"] * 3
    assert all(client.same_file(d) for d in docs[:3])
    other = dict(docs[0], size=docs[0]["size"] + 1)  # a different file under the same id
    assert client.record([other])[0]["error"] == "conflict" and not client.same_file(other)

    deadline = time.monotonic() + 300
    while not follower.finished() and time.monotonic() < deadline:
        follower.poll()
        time.sleep(0.5)
    assert follower.finished(), f"{len(follower.known)} files followed, not all finished"

    final = {r["id"]: r["value"]["rev"] for r in client.rows(TASK)}
    assert len(final) == FILES
    received: dict[str, list[str]] = {}
    for row in follower.seen:
        received.setdefault(row["id"], []).append(row["value"]["rev"])
    for doc_id, rev in final.items():
        assert received[doc_id].count(rev) == 1, (doc_id, received[doc_id])
        assert len(received[doc_id]) == len(set(received[doc_id]))
    assert len(follower.seen) > FILES  # states on the way were seen, not only the ends
