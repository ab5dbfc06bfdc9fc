"""Where the store's time goes during a simulation (`aso sim --profile-store`, make bench-long).

* The embedded store (pouchdb-server, one Node.js process): V8's sampling profiler over the
  steady part of the injection (deploy/store/cpu-profile.js, started and stopped by SIGUSR2),
  summarised as the share of the process's busy time under each kind of work: validation
  (validate_doc_update), view map functions, changes feeds, writes, reads, HTTP and JSON,
  storage (LevelDB), garbage collection.
* CouchDB: its own counters (`/_node/_local/_stats`) over the same span: the JavaScript query
  server's time per kind of call (validation, map, process resets), requests by method,
  documents written and read, view rows mapped.

The raw profile stays in the run's workspace (`profile/*.cpuprofile`, which Chrome DevTools
opens) for a closer look.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aso.store import Server

# Kinds of work of the embedded store, each recognised by the frames of a sample's stack: the
# first rule (in this order) that a frame of the stack matches names the sample's kind. A
# sample's stack runs from the event loop's entry down to the frame that was running.
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("garbage collection", ("(garbage collector)",)),
    ("validation (validate_doc_update)", ("pouchdb-validation", "validate_doc_update")),
    ("views (map functions, index updates)", ("mapreduce", "pouchdb-abstract-mapreduce")),
    ("changes feeds", ("changes", "Changes")),
    ("writes (bulk_docs)", ("bulkDocs", "bulk_docs", "_bulkDocs", "writeDoc")),
    ("reads (documents, all_docs)", ("allDocs", "_allDocs", "_get", "bulkGet")),
    (
        "storage (LevelDB)",
        ("leveldown", "levelup", "level-", "encoding-down", "deferred-leveldown"),
    ),
    ("HTTP and JSON", ("express", "body-parser", "_http_", "http.js", "JSON", "raw-body")),
)
IDLE = ("(idle)", "(program)")


def kind_of(frames: list[str]) -> str:
    for kind, marks in KINDS:
        if any(mark in frame for frame in frames for mark in marks):
            return kind
    return "other"


def frame_text(node: Mapping[str, Any]) -> str:
    call = node.get("callFrame", {})
    return f"{call.get('functionName', '')} {call.get('url', '')}"


def summarise_cpuprofile(path: Path) -> dict[str, Any]:
    """Busy seconds of the profiled span and each kind's share of them (idle left out)."""
    profile = json.loads(path.read_text())
    nodes = {node["id"]: node for node in profile["nodes"]}
    parent: dict[int, int] = {}
    for node in profile["nodes"]:
        for child in node.get("children", []):
            parent[child] = node["id"]
    kinds: dict[int, str] = {}

    def kind_of_node(node_id: int) -> str:
        if node_id not in kinds:
            frames, at = [], node_id
            while at in nodes:
                frames.append(frame_text(nodes[at]))
                at = parent.get(at, -1)
            leaf = nodes[node_id].get("callFrame", {}).get("functionName", "")
            kinds[node_id] = "idle" if leaf in IDLE else kind_of(frames)
        return kinds[node_id]

    seconds: Counter[str] = Counter()
    for node_id, delta in zip(profile["samples"], profile["timeDeltas"], strict=False):
        seconds[kind_of_node(node_id)] += delta / 1e6
    span = (profile["endTime"] - profile["startTime"]) / 1e6
    busy = sum(v for k, v in seconds.items() if k != "idle")
    return {
        "span_s": round(span, 1),
        "busy_s": round(busy, 1),
        "busy_share_of_span": round(busy / span, 3) if span else None,
        "kinds": {k: round(v / busy, 3) for k, v in seconds.most_common() if k != "idle" and busy},
        "file": str(path),
    }


def couchdb_stats(admin: Server) -> dict[str, float]:
    """CouchDB's counters, flattened ("couchdb.query_server.time.ddoc_vdu" → value); a
    histogram counts as its number of values and their sum."""
    flat: dict[str, float] = {}

    def walk(tree: Mapping[str, Any], prefix: str) -> None:
        for key, value in tree.items():
            if isinstance(value, Mapping) and "value" in value:
                number = value["value"]
                if isinstance(number, Mapping):
                    n = float(number.get("n") or 0)
                    flat[f"{prefix}{key}.n"] = n
                    flat[f"{prefix}{key}.sum"] = n * float(number.get("arithmetic_mean") or 0)
                elif isinstance(number, int | float):
                    flat[f"{prefix}{key}"] = float(number)
            elif isinstance(value, Mapping):
                walk(value, f"{prefix}{key}.")

    walk(admin.raw("GET", "/_node/_local/_stats"), "")
    return flat


# CouchDB's counters the profile reports (their increase over the span, per injected file).
# Counters only: a histogram (`couchdb.request_time`) covers CouchDB's last stats interval
# (10 s), not the span, and its difference between two reads can be negative.
COUCHDB_FIGURES = {
    "JavaScript: validation (ms)": "couchdb.query_server.time.ddoc_vdu",
    "JavaScript: map (ms)": "couchdb.query_server.time.map",
    "JavaScript: reset and teach functions (ms)": (
        "couchdb.query_server.time.reset",
        "couchdb.query_server.time.add_fun",
        "couchdb.query_server.time.ddoc_new",
    ),
    "JavaScript: process starts": "couchdb.query_server.process_starts",
    "JavaScript calls: validation": "couchdb.query_server.calls.ddoc_vdu",
    "JavaScript calls: map batches": "couchdb.query_server.calls.map",
    "JavaScript calls: reset": "couchdb.query_server.calls.reset",
    "JavaScript calls: teach a function": "couchdb.query_server.calls.add_fun",
    "JavaScript calls: teach a design document": "couchdb.query_server.calls.ddoc_new",
    "HTTP requests": "couchdb.httpd.requests",
    "documents written": "couchdb.document_writes",
    "database reads": "couchdb.database_reads",
    "view reads": "couchdb.httpd.view_reads",
    "documents mapped by views": "couchdb.mrview.map_doc",
    "changes feeds opened": "couchdb.httpd.clients_requesting_changes",
}
MICROSECOND_COUNTERS = ("couchdb.query_server.time.",)


def couchdb_figures(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    figures: dict[str, float] = {}
    for name, keys in COUCHDB_FIGURES.items():
        total = 0.0
        for key in (keys,) if isinstance(keys, str) else keys:
            delta = after.get(key, 0.0) - before.get(key, 0.0)
            total += delta / 1000 if key.startswith(MICROSECOND_COUNTERS) else delta
        figures[name] = round(total, 1)
    return figures


class StoreProfiler:
    """Profiles the store from `start()` to `stop()`: the embedded store's CPU profile (its
    pid; the store must have been started with ASO_STORE_CPU_PROFILE set to `directory`), or
    CouchDB's counters (any CouchDB the admin reaches)."""

    def __init__(self, admin: Server, engine: str, pid: int | None, directory: Path):
        self.admin, self.engine, self.pid, self.directory = admin, engine, pid, directory
        self.before: dict[str, float] = {}
        self.started = 0.0

    def start(self) -> None:
        self.started = time.time()
        if self.engine == "couchdb":
            self.before = couchdb_stats(self.admin)
        elif self.pid:
            os.kill(self.pid, signal.SIGUSR2)

    def stop(self, files: int) -> dict[str, Any]:
        """The profile of the span, with CouchDB's figures also per file injected."""
        span = round(time.time() - self.started, 1)
        if self.engine == "couchdb":
            figures = couchdb_figures(self.before, couchdb_stats(self.admin))
            per_file = {k: round(v / files, 3) for k, v in figures.items()} if files else {}
            return {"engine": "couchdb", "span_s": span, "totals": figures, "per_file": per_file}
        if not self.pid:
            return {
                "engine": self.engine,
                "span_s": span,
                "error": "the embedded store is profiled only when the simulator starts it",
            }
        known = set(self.directory.glob("*.cpuprofile"))
        os.kill(self.pid, signal.SIGUSR2)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            new = sorted(set(self.directory.glob("*.cpuprofile")) - known)
            if new:
                time.sleep(0.5)  # written in one go; give it a moment to be closed
                return {"engine": self.engine, **summarise_cpuprofile(new[-1])}
            time.sleep(0.2)
        return {"engine": self.engine, "span_s": span, "error": "no profile was written"}
