"""Prometheus metrics of the agents and the front end: what they are, and how they are served.

Every process (an agent instance, the front end) exposes its own metrics over plain HTTP at
`/metrics` on `metrics.host`; Prometheus adds `instance`/`job` labels when it scrapes. An agent
takes the first free port from `metrics.port` upward (several agents share a host, each on its
own port) and records its address in its heartbeat, so that `aso metrics targets` can write
Prometheus's file-based service discovery; the front end serves on `metrics.frontend_port`.

Names (see deploy/README.md, "Metrics and alarms", for what to watch):

aso_file_transitions_total{agent,axis,from_state,to_state}   files an agent moved, by move
aso_file_state_seconds{agent,axis,state}      how long a file had been in `state` when an
                                              agent moved it out (histogram)
aso_transfer_service_calls_total{service,call}               calls to the transfer service
aso_transfer_service_errors_total{service,call,error_class}  of which failed
aso_transfer_service_seconds{service,call}    their duration (histogram)
aso_store_requests_total{db,route,method,code}              HTTP requests to the store
aso_store_request_seconds{db,route,method}    time to the answer's headers (histogram;
                                              `_changes` long polls included: they wait)
aso_store_unavailable_total                   calls that found the store unreachable
aso_store_conflicts_total{db,route}           409s: single writes and bulk-write entries
aso_agent_cycles_total{agent}, aso_agent_cycle_seconds{agent}, aso_agent_work{agent},
aso_agent_store_errors_total{agent}, aso_agent_info{agent,instance,host}
aso_files{axis,state}                         (analytics) requests per state, from the
                                              monitoring summaries
aso_link_files{source,destination,state}      (analytics) requests per link and state
aso_backlog                                   (analytics) files on their way (not final)
aso_failed_attempts{error_class}              (analytics) failed attempts so far, by class
aso_frontend_requests_total{method,code}, aso_frontend_request_seconds{method},
aso_frontend_refusals_total{reason}           (front end) requests, and certificates refused
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

import requests
from prometheus_client import Counter, Gauge, Histogram, start_http_server

from aso.config import METRICS_PORT_SPAN

log = logging.getLogger("aso.metrics")

# Seconds: a transfer's stages take from a second (submission) to a day (a long retry cool-off).
STATE_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

FILE_TRANSITIONS = Counter(
    "aso_file_transitions",
    "Files an agent moved from one state to another.",
    ["agent", "axis", "from_state", "to_state"],
)
FILE_STATE_SECONDS = Histogram(
    "aso_file_state_seconds",
    "How long a file had been in a state when an agent moved it out.",
    ["agent", "axis", "state"],
    buckets=STATE_BUCKETS,
)
SERVICE_CALLS = Counter(
    "aso_transfer_service_calls", "Calls to the transfer service.", ["service", "call"]
)
SERVICE_ERRORS = Counter(
    "aso_transfer_service_errors",
    "Calls to the transfer service that failed, by error class.",
    ["service", "call", "error_class"],
)
SERVICE_SECONDS = Histogram(
    "aso_transfer_service_seconds",
    "Duration of calls to the transfer service.",
    ["service", "call"],
    buckets=CALL_BUCKETS,
)
STORE_REQUESTS = Counter(
    "aso_store_requests", "HTTP requests to the store.", ["db", "route", "method", "code"]
)
STORE_SECONDS = Histogram(
    "aso_store_request_seconds",
    "Time from a store request to its answer's headers.",
    ["db", "route", "method"],
    buckets=CALL_BUCKETS,
)
STORE_UNAVAILABLE = Counter(
    "aso_store_unavailable", "Store calls that found the store unreachable or timed out."
)
STORE_CONFLICTS = Counter(
    "aso_store_conflicts", "Writes the store refused as conflicts (409).", ["db", "route"]
)
STORE_CONTESTED = Counter(
    "aso_store_contested_writes",
    "Writes a CouchDB cluster stored below its quorum (202): treated as conflicts.",
    ["db"],
)
AGENT_CYCLES = Counter("aso_agent_cycles", "Cycles an agent ran.", ["agent"])
AGENT_CYCLE_SECONDS = Histogram(
    "aso_agent_cycle_seconds", "Duration of an agent's cycles.", ["agent"], buckets=CALL_BUCKETS
)
AGENT_WORK = Gauge("aso_agent_work", "Documents in this instance's part of the work.", ["agent"])
AGENT_STORE_ERRORS = Counter(
    "aso_agent_store_errors", "Cycles cut short by a store error.", ["agent"]
)
AGENT_CYCLE_ERRORS = Counter(
    "aso_agent_cycle_errors", "Cycles cut short by an error of the agent itself.", ["agent"]
)
DOCUMENT_ERRORS = Counter(
    "aso_document_errors",
    "Errors of an agent's own on one request, left for the next cycle (set aside after "
    "agents.set_aside_after in a row).",
    ["agent"],
)
SET_ASIDE = Counter(
    "aso_documents_set_aside",
    "Requests an agent could not act on and set aside, with the reason in the document.",
    ["agent"],
)
CONTROLS = Gauge(
    "aso_controls",
    "Operators' controls in force (a site banned or draining, a user banned), as the submitter"
    " read them last: 1 each.",
    ["kind", "name", "mode", "direction"],
)
HELD_BACK = Gauge(
    "aso_files_held_back",
    "Files ready to start that the submitter held back in its last cycle, by the control that"
    " holds them.",
    ["kind", "name", "mode"],
)
HELD = Gauge(
    "aso_files_held",
    "Files ready to start that a hold kept back in the submitter's last cycle (a destination"
    " without room or permission for their user), by destination and class.",
    ["site", "error_class"],
)
AGENT_INFO = Gauge(
    "aso_agent_info", "This process's agent and instance.", ["agent", "instance", "host"]
)
FILES = Gauge(
    "aso_files", "Requests per state (analytics, monitoring summaries).", ["axis", "state"]
)
LINK_FILES = Gauge(
    "aso_link_files",
    "Requests per link and state (analytics, monitoring summaries).",
    ["source", "destination", "state"],
)
BACKLOG = Gauge("aso_backlog", "Files on their way: state not final (analytics).")
FAILED_ATTEMPTS = Gauge(
    "aso_failed_attempts", "Failed attempts so far, by error class (analytics).", ["error_class"]
)
FRONTEND_REQUESTS = Counter(
    "aso_frontend_requests", "Requests the front end answered.", ["method", "code"]
)
FRONTEND_SECONDS = Histogram(
    "aso_frontend_request_seconds",
    "Time the front end took to answer.",
    ["method"],
    buckets=CALL_BUCKETS,
)
FRONTEND_REFUSALS = Counter(
    "aso_frontend_refusals", "Clients the front end refused, by reason.", ["reason"]
)


# --- serving ---------------------------------------------------------------------------------
def serve_agent(host: str, first_port: int) -> int | None:
    """Serve this process's metrics on the first free port from `first_port` upward; the port,
    or None when `first_port` is 0 (metrics off) or no port in the span is free."""
    if first_port <= 0:
        return None
    for port in range(first_port, first_port + METRICS_PORT_SPAN):
        try:
            start_http_server(port, addr=host)
        except OSError:
            continue
        log.info("metrics on http://%s:%d/metrics", host, port)
        return port
    log.warning(
        "metrics off: no free port in %d-%d", first_port, first_port + METRICS_PORT_SPAN - 1
    )
    return None


def address(host: str, port: int) -> str:
    """host:port as Prometheus should scrape it (a wildcard bind names this host)."""
    if host in ("", "0.0.0.0", "::"):
        host = socket.getfqdn()
    return f"{host}:{port}"


def file_sd_targets(heartbeats: Iterable[Mapping[str, Any]], expiry: float) -> list[dict[str, Any]]:
    """Prometheus file_sd entries for the live agent instances that serve metrics."""
    now = time.time()
    out = []
    for beat in sorted(heartbeats, key=lambda b: (b.get("agent", ""), b.get("instance", ""))):
        if beat.get("stopped") or now - beat.get("last_seen", 0) >= expiry:
            continue
        if not beat.get("metrics"):
            continue
        labels = {"agent": beat["agent"], "aso_instance": beat["instance"]}
        out.append({"targets": [beat["metrics"]], "labels": labels})
    return out


# --- the store -------------------------------------------------------------------------------
_DB_ROUTES = {"_all_docs", "_bulk_docs", "_bulk_get", "_changes", "_security", "_find",
              "_compact", "_view_cleanup", "_revs_diff", "_purge", "_index"}  # fmt: skip


def store_route(path: str) -> tuple[str, str]:
    """(db, route) of a store URL path, with document ids and names cut out so that labels
    stay few: `/files/_bulk_docs` → (files, _bulk_docs); `/files/abc` → (files, doc);
    `/files/_design/x/_view/y` → (files, _view); `/_session` → ("", _session)."""
    parts = [unquote(p) for p in path.strip("/").split("/") if p]
    if not parts:
        return "", "/"
    if parts[0].startswith("_"):
        return "", parts[0]
    db = parts[0]
    if len(parts) == 1:
        return db, "db"
    second = parts[1]
    if second == "_design":
        return db, parts[3] if len(parts) > 3 and parts[3].startswith("_") else "design"
    if second == "_local":
        return db, "_local"
    if second in _DB_ROUTES:
        return db, second
    return db, "doc" if len(parts) == 2 else "attachment"


def observe_store_response(response: requests.Response, *args: Any, **kwargs: Any) -> None:
    """A requests response hook on the store's session: one answer of the store."""
    db, route = store_route(urlsplit(response.request.url or "").path)
    method = response.request.method or ""
    STORE_REQUESTS.labels(db, route, method, str(response.status_code)).inc()
    STORE_SECONDS.labels(db, route, method).observe(response.elapsed.total_seconds())
    if response.status_code == 409:
        STORE_CONFLICTS.labels(db, route).inc()


def count_bulk_conflicts(db: str, conflicts: int) -> None:
    if conflicts:
        STORE_CONFLICTS.labels(db, "_bulk_docs").inc(conflicts)


def count_contested(db: str) -> None:
    STORE_CONTESTED.labels(db).inc()


# --- files -----------------------------------------------------------------------------------
def moves_of(
    doc: Mapping[str, Any], before: Mapping[str, Any] | None = None
) -> list[tuple[str, str, str, float]]:
    """(axis, from, to, seconds spent in `from`) of the changes one write of `doc` made: the
    history entries stamped at its `last_update` (aso.model.transition stamps all the entries
    of one write, and `last_update`, with one time) and, when `before` (the version the agent
    read) is known, past the entries it had: a write that moved nothing (a lease renewed) keeps
    `last_update`, and entries another agent added meanwhile have stamps of their own."""
    history = doc.get("history") or []
    first = len(before.get("history") or []) if before is not None else 0
    stamp = doc.get("last_update")
    made = [i for i in range(first, len(history)) if history[i].get("at") == stamp]
    moves = []
    for i in made:
        entry = history[i]
        if entry.get("from") is None:  # the creation entry: not a move
            continue
        entered = _entered(history[:i], entry["axis"])
        seconds = max(0.0, float(entry["at"]) - entered) if entered is not None else float("nan")
        moves.append((entry["axis"], entry["from"], entry["to"], seconds))
    return moves


def _entered(earlier: list[Mapping[str, Any]], axis: str) -> float | None:
    """When the file entered its current value of `axis`: the last earlier entry on that axis,
    else the creation (the first entry: other axes start with the request)."""
    for entry in reversed(earlier):
        if entry.get("axis") == axis:
            return float(entry["at"])
    return float(earlier[0]["at"]) if earlier else None


def record_writes(
    agent: str,
    docs: Iterable[Mapping[str, Any]],
    before: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """Count the moves of the documents an agent wrote (`before`: their previous versions, by
    id, where the agent knows them)."""
    before = before or {}
    for doc in docs:
        for axis, frm, to, seconds in moves_of(doc, before.get(doc.get("_id", ""))):
            FILE_TRANSITIONS.labels(agent, axis, frm, to).inc()
            if seconds == seconds:  # not NaN: the history says when `frm` began
                FILE_STATE_SECONDS.labels(agent, axis, frm).observe(seconds)


# --- the monitoring summaries ----------------------------------------------------------------
def export_summaries(
    totals: Mapping[str, Mapping[str, int]],
    links: Mapping[str, Mapping[str, int]],
    errors: Mapping[str, Mapping[str, int]],
    backlog: int,
) -> None:
    """Set the analytics gauges from the live monitoring summaries (`errors`: link → error
    class → failed attempts). A state that emptied is left out of the summaries: its gauge
    goes to 0, not stays at its last value."""
    _set_all(FILES, {(axis, state): n for axis, states in totals.items()
                     for state, n in states.items()})  # fmt: skip
    _set_all(LINK_FILES, {(*link.partition(">")[::2], state): n for link, states in links.items()
                          for state, n in states.items()})  # fmt: skip
    by_class: dict[tuple[str, ...], int] = {}
    for classes in errors.values():
        for error_class, n in classes.items():
            by_class[(error_class,)] = by_class.get((error_class,), 0) + n
    _set_all(FAILED_ATTEMPTS, by_class)
    BACKLOG.set(backlog)


_exported: dict[str, set[tuple[str, ...]]] = {}


def _set_all(gauge: Gauge, values: Mapping[tuple[str, ...], float]) -> None:
    """Set every labelled value of `gauge`; the ones set before and missing now become 0."""
    seen = _exported.setdefault(gauge._name, set())
    for labels in seen - set(values):
        gauge.labels(*labels).set(0)
    for labels, n in values.items():
        gauge.labels(*labels).set(n)
    seen.update(values)


# --- the transfer service --------------------------------------------------------------------
class Timed:
    """Count and time one call to the transfer service (`with Timed(service, "submit"):`);
    a TransferError's class (or the exception's type) labels a failure."""

    def __init__(self, service: str, call: str):
        self.service, self.call = service, call

    def __enter__(self) -> Timed:
        self.start = time.monotonic()
        return self

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: Any) -> None:
        SERVICE_CALLS.labels(self.service, self.call).inc()
        SERVICE_SECONDS.labels(self.service, self.call).observe(time.monotonic() - self.start)
        if exc is not None:
            error_class = getattr(exc, "error_class", None) or type(exc).__name__
            SERVICE_ERRORS.labels(self.service, self.call, error_class).inc()
