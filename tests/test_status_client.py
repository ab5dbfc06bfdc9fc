"""A client of the status API written from docs/status-api.md and docs/frontend.md alone, as a
CRAB-style integrator would: it imports nothing from ASO (HTTPS with `requests` and the standard
library) and goes through the X.509 front end as a real client does, with the user's proxy over
TLS, verifying the front end against the grid CA. It records a task of 1,000 files, tells a 409
"already recorded" from a 409 "a different file" by the answer alone, pages through the task,
and follows it by the store's sequence while the agents copy, clean and publish the files, on
both stores. Every file's final state must reach it exactly once.

The fixtures give it what a user is given: the front end's address, the CA file, a proxy, the
name the front end maps it to, the files database's name and the catalogue's site names."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import jsonschema_rs
import requests
import yaml

FILES = 1000
PAGE = 100
TASK = "261125_100000:wendy_client"
# 40 output files to publish, all on the first link, recorded while the client follows
PUBLISHED_JOBS = range(FILES // 2 + 3, FILES // 2 + 121, 3)
FINAL = {"state": {"done", "failed", "killed"}, "cleanup": {"cleaned", "not_needed"},
         "publication": {"published", "publication_failed", "not_required"}}  # fmt: skip
OPENAPI = Path(__file__).resolve().parent.parent / "docs" / "openapi.yaml"
# What a creation's 409 says through the front end (docs/status-api.md, "Recording a request").
RECORDED, ALREADY, DIFFERENT = "recorded", "already recorded", "a different file"


class Client:
    """docs/status-api.md, section by section, through the front end."""

    def __init__(self, door: Any):
        self.http = requests.Session()
        self.http.cert = door.proxy  # certificate, key and chain in one file
        self.ca_file = door.ca_file
        self.user = door.user
        self.base = f"{door.url}/{door.db}"
        self.views = f"{self.base}/_design/asyncstageout/_view"
        self.sent: list[tuple[str, str]] = []  # (method, URL) of every request

    def call(self, method: str, url: str, **kw: Any) -> requests.Response:
        self.sent.append((method, url))
        # The CA on each request: a session's own `verify` loses to $REQUESTS_CA_BUNDLE.
        return self.http.request(method, url, timeout=60, verify=self.ca_file, **kw)

    def get(self, url: str, **params: Any) -> Any:
        answer = self.call("GET", url, params=params)
        answer.raise_for_status()
        return answer.json()

    def post(self, url: str, body: Any, **params: Any) -> requests.Response:
        return self.call("POST", url, json=body, params=params)

    # -- Recording a request --------------------------------------------------------------------
    def request(self, job: int, source: str, destination: str, size: int = 1000) -> dict[str, Any]:
        source_lfn = f"/store/temp/user/{self.user}/client/{TASK.split(':')[0]}/out_{job}.root"
        now = time.time()
        publish = job in PUBLISHED_JOBS
        doc = {
            "_id": hashlib.sha256(source_lfn.encode()).hexdigest(),
            "type": "transfer_request", "schema": 1, "user": self.user, "task": TASK,
            "job_id": str(job), "job_retry": 0, "file_type": "output",
            "source": source, "destination": destination, "source_lfn": source_lfn,
            "destination_lfn": source_lfn.replace("/store/temp/user/", "/store/user/"),
            "size": size, "checksum": {"adler32": "0a1b2c3d"}, "publish": publish,
            "state": "new", "cleanup": "pending",
            "publication": "pending" if publish else "not_required",
            "created": now, "last_update": now,
            "history": [{"axis": "state", "from": None, "to": "new", "at": now, "by": self.user}],
        }  # fmt: skip
        if publish:
            doc["publish_info"] = {"dataset": f"/Prim/{self.user}-client-v1/USER", "events": 10}
        return doc

    def record(self, docs: list[dict[str, Any]]) -> list[str]:
        """Each document's outcome, from the one `_bulk_docs` answer."""
        answer = self.post(f"{self.base}/_bulk_docs", {"docs": docs})
        assert answer.status_code in (201, 202), answer.text
        # Matched by id: the embedded store does not answer in the order of the documents.
        by_id = {e["id"]: e for e in answer.json()}
        return [outcome(by_id[d["_id"]]) for d in docs]

    def record_one(self, doc: dict[str, Any]) -> str:
        """`PUT /db/ID`: its outcome, from the status and the reason."""
        answer = self.call("PUT", f"{self.base}/{doc['_id']}", json=doc)
        if answer.status_code in (201, 202):
            return RECORDED
        assert answer.status_code == 409, answer.text
        return outcome({"id": doc["_id"], **answer.json()})

    # -- Reading a task -------------------------------------------------------------------------
    def rows(self, task: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        end = json.dumps([task, {}])
        params: dict[str, Any] = {"start_key": json.dumps([task]), "end_key": end}
        while True:
            page = self.get(f"{self.views}/by_task", limit=PAGE, **params)["rows"]
            rows += page
            if len(page) < PAGE:
                return rows
            params.update(start_key=json.dumps(page[-1]["key"]), skip=1)

    def size(self, task: str) -> int:
        got = self.get(f"{self.views}/task_states", start_key=json.dumps([task, "state"]),
                       end_key=json.dumps([task, "state", {}]), group_level=2)["rows"]  # fmt: skip
        return int(got[0]["value"]) if got else 0


def rows_schema() -> jsonschema_rs.Draft202012Validator:
    """A page of by_task rows as docs/openapi.yaml describes it (its $refs resolved within
    the file's components)."""
    components = yaml.safe_load(OPENAPI.read_text())["components"]
    rows = components["schemas"]["TaskRows"]["properties"]["rows"]
    return jsonschema_rs.Draft202012Validator(
        {"$ref": "#/components/rows", "components": {**components, "rows": rows}}
    )


def outcome(entry: dict[str, Any]) -> str:
    """A creation's result: recorded, or a 409 whose reason says which kind."""
    if "rev" in entry and "error" not in entry:
        return RECORDED
    assert entry.get("error") == "conflict", entry
    reason = entry["reason"]
    if reason.startswith("already recorded"):
        return ALREADY
    assert reason.startswith("a different file"), reason
    return DIFFERENT


class Follower:
    """docs/status-api.md, "Following a task"."""

    def __init__(self, client: Client, task: str):
        self.client, self.task = client, task
        self.known: dict[str, dict[str, Any]] = {}  # id → its last row
        self.seen: list[dict[str, Any]] = []  # every row received, in order

    def start(self) -> None:
        self.seq = self.client.get(self.client.base)["update_seq"]  # kept as it is
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


def test_a_client_through_the_front_end_records_pages_and_follows_a_task(
    front_door, agents_in_background
):
    client = Client(front_door)
    session = client.get(f"{front_door.url}/_session")
    assert session["userCtx"]["name"] == front_door.user  # the proxy says who the client is
    sites = front_door.sites
    links = [(sites[i], sites[-1 - i]) for i in range(3)]
    docs = [client.request(job, *links[job % 3]) for job in range(1, FILES + 1)]
    # The first half is recorded before the client starts following, the rest while it does
    # (a task grows while its jobs end).
    for start in range(0, FILES // 2, 250):
        assert set(client.record(docs[start : start + 250])) == {RECORDED}

    follower = Follower(client, TASK)
    follower.start()
    rows = client.rows(TASK)
    assert len(rows) == FILES // 2 and len({r["id"] for r in rows}) == FILES // 2
    jobs = [int(r["value"]["job_id"]) for r in rows]
    assert jobs == sorted(jobs)  # numeric job order, across pages of 100

    for start in range(FILES // 2, FILES, 250):
        assert set(client.record(docs[start : start + 250])) == {RECORDED}
        follower.poll()
    # Recording the same files again (a stage-out run twice) and a different file under a
    # recorded id: one answer each tells which, with no second request.
    other = dict(docs[3], size=docs[3]["size"] + 1)
    before = len(client.sent)
    assert client.record([*docs[:3], other]) == [ALREADY, ALREADY, ALREADY, DIFFERENT]
    assert client.record_one(docs[0]) == ALREADY
    assert client.record_one(dict(docs[1], checksum={"adler32": "ffffffff"})) == DIFFERENT
    assert [method for method, _ in client.sent[before:]] == ["POST", "PUT", "PUT"]

    deadline = time.monotonic() + 300
    while not follower.finished() and time.monotonic() < deadline:
        follower.poll()
        time.sleep(0.5)
    assert follower.finished(), f"{len(follower.known)} files followed, not all finished"

    final = {r["id"]: r for r in client.rows(TASK)}
    assert len(final) == FILES
    rows_schema().validate(list(final.values()))  # the rows docs/openapi.yaml describes
    # The changed files' rows came by key (POST by_task), as the docs say to ask for them.
    assert any(m == "POST" and u.endswith("/_view/by_task") for m, u in client.sent)
    received: dict[str, list[str]] = {}
    for row in follower.seen:
        received.setdefault(row["id"], []).append(row["value"]["rev"])
    for doc_id, row in final.items():
        assert received[doc_id].count(row["value"]["rev"]) == 1, (doc_id, received[doc_id])
        assert len(received[doc_id]) == len(set(received[doc_id]))
    assert len(follower.seen) > FILES  # states on the way were seen, not only the ends
    # Publication: the published jobs' files went from pending to published, the others
    # needed none; every file's temporary copy was removed.
    published = {d["_id"] for d in docs if d["publish"]}
    assert {i for i, r in final.items() if r["value"]["publication"] == "published"} == published
    assert {r["value"]["publication"] for i, r in final.items() if i not in published} == {
        "not_required"
    }
    pending = {r["id"] for r in follower.seen if r["value"]["publication"] == "pending"}
    assert pending and pending <= published  # seen waiting for their publication, too
    assert {r["value"]["cleanup"] for r in final.values()} == {"cleaned"}
    assert {r["value"]["state"] for r in final.values()} == {"done"}
