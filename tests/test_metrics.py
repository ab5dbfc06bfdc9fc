"""Prometheus metrics: agents under `aso run --agents-only` move files through the sim back end
(with failures and retries); `aso metrics targets` finds them from their heartbeats; what their
/metrics say matches what the documents say."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from aso import metrics, model
from aso.config import Config
from aso.local.stores import free_port
from aso.provision.designdocs import init_databases
from aso.sites import simulated
from aso.store import Server
from aso.store import admin as store_admin
from aso.upload import judged_request
from tests.conftest import SIM_SITES, sample_request, write_config
from tests.pipeline_helpers import wait_for

ASO = str(Path(sys.executable).parent / "aso")
AGENTS = ("submitter", "monitor", "retry-manager", "analytics")
LINKS = (("T2_CH_CERN", "T2_DE_DESY"), ("T2_IT_Pisa", "T2_DE_DESY"))


# --- the pure parts ----------------------------------------------------------------------------
def test_moves_of_a_write_are_its_new_history_entries_with_the_time_spent_before():
    doc = judged_request(**_request_fields(), at=1000.0)
    submitted = model.transition(doc, [model.Change("state", "submitted", "submitter")],
                                 model.AGENT, at=1010.0)  # fmt: skip
    done = model.transition(
        submitted, [model.Change("state", "done", "monitor")], model.AGENT, at=1012.5
    )
    assert metrics.moves_of(submitted, doc) == [("state", "new", "submitted", 10.0)]
    assert metrics.moves_of(done, submitted) == [("state", "submitted", "done", 2.5)]
    # Without the version before, the entries stamped at last_update are the write's.
    assert metrics.moves_of(done) == [("state", "submitted", "done", 2.5)]
    # A write that moves nothing (a lease renewed) keeps last_update: no move counted twice.
    renewed = dict(submitted, lease={"until": 2000.0})
    assert metrics.moves_of(renewed, submitted) == []
    assert metrics.moves_of(doc) == []  # the creation is not a move


def _request_fields() -> dict[str, Any]:
    return {
        "user": "alice",
        "task": "261121_120000:alice_task1",
        "job_id": 1,
        "source": "T2_CH_CERN",
        "destination": "T2_DE_DESY",
        "source_lfn": "/store/temp/user/alice/a.root",
        "destination_lfn": "/store/user/alice/a.root",
        "size": 1000,
        "adler32": "0badcafe",
    }


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/files/_bulk_docs", ("files", "_bulk_docs")),
        ("/files/abc123", ("files", "doc")),
        ("/files/_design/asyncstageout/_view/by_state", ("files", "_view")),
        ("/files/_changes", ("files", "_changes")),
        ("/files", ("files", "db")),
        ("/_session", ("", "_session")),
        ("/files/heartbeat%3Asubmitter%3Ahost-0", ("files", "doc")),
        ("/", ("", "/")),
    ],
)
def test_store_routes_keep_labels_few(path, expected):
    assert metrics.store_route(path) == expected


def test_zeroed_states_do_not_keep_their_last_value():
    metrics.export_summaries({"state": {"new": 3, "done": 1}}, {"A>B": {"new": 3}}, {}, 3)
    metrics.export_summaries({"state": {"done": 4}}, {"A>B": {"done": 4}}, {}, 0)
    assert metrics.FILES.labels("state", "new")._value.get() == 0
    assert metrics.FILES.labels("state", "done")._value.get() == 4
    assert metrics.LINK_FILES.labels("A", "B", "new")._value.get() == 0


# --- a run ---------------------------------------------------------------------------------------
@pytest.fixture()
def metrics_config(store_config: Config, admin: Server, tmp_path: Path) -> Iterator[Config]:
    """Fresh files, jobs and stats databases; the sim back end failing 30 % of the attempts;
    quick retries; metrics from a free port upward."""
    suffix = uuid.uuid4().hex[:8]
    config = dataclasses.replace(
        store_config,
        source=tmp_path / "aso.toml",
        store=dataclasses.replace(
            store_config.store,
            files_db=f"files_{suffix}",
            transfers_db=f"jobs_{suffix}",
            stats_db=f"stats_{suffix}",
        ),
        transfer=dataclasses.replace(
            store_config.transfer, backend="sim", max_files_per_job=5, status_interval=0.3
        ),
        sites=simulated(SIM_SITES),
        sim=dataclasses.replace(
            store_config.sim, mean_duration=0.3, distribution="fixed", failure_rate=0.3, seed=7
        ),
        retry=dataclasses.replace(store_config.retry, base_delay=0.2, max_delay=0.5, jitter=0.0),
        analytics=dataclasses.replace(store_config.analytics, summary_interval=0.5),
        agents=dataclasses.replace(
            store_config.agents,
            poll_interval=0.3,
            heartbeat_interval=0.5,
            heartbeat_expiry=5.0,
            # every other agent 0: one the file does not name runs its default count
            instances={
                **dict.fromkeys(store_config.agents.instances, 0),
                **dict.fromkeys(AGENTS, 1),
            },
            log_dir=str(tmp_path / "log"),
        ),
        metrics=dataclasses.replace(store_config.metrics, port=free_port()),
    )
    init_databases(admin, config)
    write_config(config)
    yield config
    for name in (config.store.files_db, config.store.transfers_db, config.store.stats_db):
        store_admin.delete_db(admin, name)


def scrape(address: str) -> dict[str, list[Any]]:
    """Samples by name of one /metrics page."""
    text = requests.get(f"http://{address}/metrics", timeout=10).text
    samples: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def total(pages: list[dict[str, list[Any]]], name: str, **labels: str) -> float:
    return sum(
        s.value
        for page in pages
        for s in page.get(name, [])
        if all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_metrics_of_a_run_match_the_documents(metrics_config, admin, accounts):
    config = metrics_config
    db = admin.db(config.store.files_db)
    docs = [
        sample_request(user, source=src, destination=dst)
        for user in ("alice", "bob")
        for src, dst in LINKS
        for _ in range(10)
    ]
    for user in ("alice", "bob"):
        mine = [d for d in docs if d["user"] == user]
        assert all(r.ok for r in accounts[user].db(config.store.files_db).bulk_write(mine))
    ids = [d["_id"] for d in docs]
    log = Path(config.agents.log_dir) / "run.out"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        run = subprocess.Popen(
            [ASO, "--config", str(config.source), "run", "--agents-only", "--host-id", "mtest"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def final() -> bool:
            return all(
                d and d["state"] in model.FINAL[model.STATE] for d in db.get_many(ids).values()
            )

        wait_for(final, 120, "every file final")
        finished = db.get_many(ids)

        # Prometheus's discovery: every agent, found from its heartbeat.
        out = subprocess.run(
            [ASO, "--config", str(config.source), "metrics", "targets"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        targets = json.loads(out.stdout)
        assert sorted(t["labels"]["agent"] for t in targets) == sorted(AGENTS)
        addresses = [t["targets"][0] for t in targets]

        # The analytics gauges catch up with the documents.
        states = Counter(d["state"] for d in finished.values())
        analytics = next(t["targets"][0] for t in targets if t["labels"]["agent"] == "analytics")

        def gauges_caught_up() -> bool:
            page = scrape(analytics)
            return all(
                total([page], "aso_files", axis="state", state=s) == n for s, n in states.items()
            )

        wait_for(gauges_caught_up, 30, f"aso_files to say {dict(states)}")
        pages = [scrape(a) for a in addresses]
    finally:
        run.terminate()
        run.wait(60)

    # Every move any agent made, counted once, by the agent that made it.
    moves: Counter[tuple[str, str, str]] = Counter()
    for doc in finished.values():
        for entry in doc["history"]:
            if entry["from"] is not None:
                moves[(entry["axis"], entry["from"], entry["to"])] += 1
    counted = Counter()
    for page in pages:
        for s in page.get("aso_file_transitions_total", []):
            key = (s.labels["axis"], s.labels["from_state"], s.labels["to_state"])
            counted[key] += int(s.value)
    assert counted == moves
    assert moves[("state", "failed_attempt", "retry")] > 0  # the failures did happen
    # Time in state: one observation per move out of a state.
    for (axis, frm, _), _n in moves.items():
        out_of = sum(n for (a, f, _), n in moves.items() if (a, f) == (axis, frm))
        observed = total(pages, "aso_file_state_seconds_count", axis=axis, state=frm)
        assert observed == out_of, (axis, frm)

    # Per link, from the analytics agent, as the documents have it.
    page = pages[addresses.index(analytics)]
    for src, dst in LINKS:
        on_link = Counter(
            d["state"] for d in finished.values() if (d["source"], d["destination"]) == (src, dst)
        )
        for state, n in on_link.items():
            assert total([page], "aso_link_files", source=src, destination=dst, state=state) == n
    assert total([page], "aso_backlog") == 0

    # The transfer service and the store, as the agents saw them.
    assert total(pages, "aso_transfer_service_calls_total", service="sim", call="submit_many") > 0
    assert total(pages, "aso_transfer_service_calls_total", service="sim", call="status") > 0
    assert total(pages, "aso_store_requests_total", db=config.store.files_db, route="_bulk_docs")
    assert total(pages, "aso_agent_cycles_total", agent="submitter") > 0
