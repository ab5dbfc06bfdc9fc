#!/usr/bin/env python3
"""A client of ASO's status API written from docs/status-api.md alone, with `requests` and the
standard library: it writes each job's output at the source site with the user's proxy (with
--write-to: docs/usage.md, "Writing the output"), records the task's files, records them again
(a stage-out run twice), kills one file and resubmits it if the kill took, and follows the task
with the store's sequence until every file is final. It prints one JSON line of what happened
and exits 0 when the task finished in time (1 otherwise).

    python docs/client-example.py --url https://aso.example.org:8443 --ca ca.pem \
        --proxy /tmp/x509up_u1000 --source T2_CH_CERN --destination T2_DE_DESY --files 20 \
        --write-to https://xrootd.cern.example:1094
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import zlib
from typing import Any

import requests

VIEWS = "_design/asyncstageout/_view"


class Aso:
    """The front end, as the user the proxy maps to."""

    def __init__(self, url: str, ca: str, proxy: str, db: str):
        self.http = requests.Session()
        self.http.cert = proxy  # certificate, key and chain in one file
        self.ca, self.root, self.db = ca, url.rstrip("/"), f"{url.rstrip('/')}/{db}"

    def call(self, method: str, path: str, **kw: Any) -> requests.Response:
        """`path` below the files database (the server's own: /_session)."""
        url = self.root + path if path == "/_session" else self.db + path
        return self.http.request(method, url, verify=self.ca, timeout=60, **kw)

    def json(self, method: str, path: str, **kw: Any) -> Any:
        answer = self.call(method, path, **kw)
        answer.raise_for_status()
        return answer.json()


def output_lfn(user: str, task: str, job: int) -> str:
    """Where a job writes its output: under the user's own temporary area."""
    return f"/store/temp/user/{user}/example/{task.split(':')[0]}/out_{job}.root"


def write_output(aso: Aso, site_url: str, lfn: str, data: bytes) -> None:
    """The job's half: its output written at the source site's HTTPS endpoint (the site
    catalogue's PFN), with the user's own proxy; the site refuses any other area."""
    answer = aso.http.put(site_url.rstrip("/") + lfn, data=data, verify=aso.ca, timeout=60)
    answer.raise_for_status()


def request(
    user: str, task: str, job: int, source: str, destination: str, data: bytes
) -> dict[str, Any]:
    """One file's request ("Recording a request"): size and adler32 of the output written."""
    lfn = output_lfn(user, task, job)
    now = round(time.time(), 3)
    return {
        "_id": hashlib.sha256(lfn.encode()).hexdigest(),
        "type": "transfer_request",
        "schema": 1,
        "user": user,
        "task": task,
        "job_id": str(job),
        "job_retry": 0,
        "file_type": "output",
        "source": source,
        "destination": destination,
        "source_lfn": lfn,
        "destination_lfn": lfn.replace("/store/temp/user/", "/store/user/"),
        "size": len(data),
        "checksum": {"adler32": f"{zlib.adler32(data) & 0xFFFFFFFF:08x}"},
        "publish": False,
        "state": "new",
        "cleanup": "pending",
        "publication": "not_required",
        "created": now,
        "last_update": now,
        "history": [{"axis": "state", "from": None, "to": "new", "at": now, "by": user}],
    }


def record(aso: Aso, docs: list[dict[str, Any]]) -> dict[str, int]:
    """Record the files; how many answers of each kind ("Codes")."""
    answers = aso.json("POST", "/_bulk_docs", json={"docs": docs})
    kinds: dict[str, int] = {}
    for entry in answers:
        kind = "recorded" if "rev" in entry else entry.get("code", entry["error"])
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def move(aso: Aso, doc_id: str, moves: dict[str, str], user: str, reason: str) -> str | None:
    """Kill or resubmit one file ("Killing and resubmitting"): its new state, or None when its
    stored state allows no such move."""
    stored = aso.json("GET", f"/{doc_id}")
    to = moves.get(stored["state"])
    if to is None:
        return None
    at = round(time.time(), 3)
    entry = {
        "axis": "state",
        "from": stored["state"],
        "to": to,
        "at": at,
        "by": user,
        "reason": reason,
    }
    changed = {**stored, "state": to, "last_update": at, "history": [*stored["history"], entry]}
    answer = aso.call("PUT", f"/{doc_id}", json=changed)
    if answer.status_code == 409:  # an agent wrote it meanwhile: read it again
        return move(aso, doc_id, moves, user, reason)
    answer.raise_for_status()
    return to


KILL = {
    "new": "killed",
    "retry": "killed",
    "failed_attempt": "killed",
    "submitted": "kill_requested",
}
RESUBMIT = {"killed": "new", "failed": "new"}


class Follower:
    """docs/status-api.md, "Following a task": the rows, then what changed after the sequence."""

    def __init__(self, aso: Aso, task: str):
        self.aso, self.task = aso, task
        self.seq = aso.json("GET", "")["update_seq"]
        self.rows: dict[str, dict[str, Any]] = {}  # id → its latest row
        self.keys: dict[str, Any] = {}  # id → its by_task key
        self.read_all()

    def read_all(self) -> None:
        start: Any = [self.task]
        skip = 0
        while True:
            page = self.aso.json(
                "GET",
                f"/{VIEWS}/by_task",
                params={
                    "start_key": json.dumps(start),
                    "end_key": json.dumps([self.task, {}]),
                    "limit": 1000,
                    "skip": skip,
                },
            )["rows"]
            for row in page:
                self.rows[row["id"]], self.keys[row["id"]] = row["value"], row["key"]
            if len(page) < 1000:
                return
            start, skip = page[-1]["key"], 1

    def poll(self) -> None:
        changed = self.aso.json(
            "POST",
            "/_changes",
            params={"filter": "_doc_ids", "since": self.seq},
            json={"doc_ids": sorted(self.rows)},
        )
        self.seq = changed["last_seq"]
        ids = sorted({c["id"] for c in changed["results"]})
        for start in range(0, len(ids), 100):
            keys = [self.keys[i] for i in ids[start : start + 100]]
            for row in self.aso.json("POST", f"/{VIEWS}/by_task", json={"keys": keys})["rows"]:
                self.rows[row["id"]] = row["value"]
        size = self.aso.json(
            "GET",
            f"/{VIEWS}/task_states",
            params={
                "start_key": json.dumps([self.task, "state"]),
                "end_key": json.dumps([self.task, "state", {}]),
                "group_level": 2,
            },
        )["rows"]
        if size and size[0]["value"] != len(self.rows):  # files recorded since
            self.read_all()

    def finished(self) -> bool:
        """No [task, "final", false] row ("Reading a task")."""
        rows = self.aso.json(
            "GET",
            f"/{VIEWS}/task_states",
            params={"key": json.dumps([self.task, "final", False]), "group_level": 3},
        )["rows"]
        return not rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the front end, https://HOST:PORT")
    parser.add_argument("--ca", required=True, help="the CA file that signed its certificate")
    parser.add_argument("--proxy", required=True, help="your proxy (certificate, key, chain)")
    parser.add_argument("--db", default="asynctransfer", help="the files database")
    parser.add_argument("--source", required=True)
    parser.add_argument("--destination", required=True)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--task", default="")
    parser.add_argument(
        "--write-to", default="", help="the source site's HTTPS endpoint: write the outputs there"
    )
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for the end")
    args = parser.parse_args()
    aso = Aso(args.url, args.ca, args.proxy, args.db)
    user = aso.json("GET", "/_session")["userCtx"]["name"]
    task = args.task or time.strftime("%y%m%d_%H%M%S") + f":{user}_example"
    outputs = {job: os.urandom(1000 + job) for job in range(1, args.files + 1)}
    if args.write_to:
        for job, data in outputs.items():
            write_output(aso, args.write_to, output_lfn(user, task, job), data)
    docs = [
        request(user, task, job, args.source, args.destination, data)
        for job, data in outputs.items()
    ]
    report: dict[str, Any] = {
        "task": task,
        "written": len(outputs) if args.write_to else 0,
        "recorded": record(aso, docs),
        "again": record(aso, docs),
    }
    victim = docs[0]["_id"]
    report["kill"] = move(aso, victim, KILL, user, "killed by the example client")
    follower = Follower(aso, task)
    deadline = time.monotonic() + args.timeout
    resubmitted = False
    while time.monotonic() < deadline:
        # Asked before the poll: when the task was finished then, the rows polled after it
        # are every file's final one.
        was_finished = follower.finished()
        follower.poll()
        row = follower.rows.get(victim, {})
        if not resubmitted and row.get("state") in RESUBMIT:
            report["resubmit"] = move(aso, victim, RESUBMIT, user, "resubmitted by the example")
            resubmitted = True
            continue  # the task is not finished any more: ask again
        if row.get("note"):
            report["kill_too_late"] = row["note"]  # the copy had finished first
        if was_finished and (resubmitted or row.get("note") or row.get("final")):
            break
        time.sleep(1)
    states: dict[str, int] = {}
    for row in follower.rows.values():
        states[row["state"]] = states.get(row["state"], 0) + 1
    report.update(
        states=states,
        finished=follower.finished(),
        final=sum(bool(r.get("final")) for r in follower.rows.values()),
    )
    print(json.dumps(report, sort_keys=True))
    return 0 if report["finished"] else 1


if __name__ == "__main__":
    sys.exit(main())
