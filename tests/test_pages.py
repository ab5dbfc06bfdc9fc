"""The monitoring pages (couchapp/pages/_attachments), served by the store itself and
driven in headless Chromium (Debian's, through Playwright): after a real run of the submitter,
monitor and publisher (sim back end) and of the analytics agent that writes the monitoring
summaries, the numbers on the pages equal counts made directly from the documents, both while
the hours are open and once they are closed; overview → task → file and overview → links →
link → task → file are clicked through; screenshots are kept as artefacts (`test-artefacts/`,
or $ASO_TEST_ARTEFACTS)."""

from __future__ import annotations

import base64
import calendar
import dataclasses
import time
from collections import Counter
from urllib.parse import quote

import pytest
import requests
from playwright.sync_api import expect

from agents.analytics import Analytics
from agents.monitor import Monitor
from agents.publisher import Publisher
from agents.submitter import Submitter
from aso import model, summaries
from aso.couchdb import ATTACHMENTS_CSP
from aso.designdocs import init_databases, pages_url
from aso.runtime import Runner
from tests.browser_helpers import ARTEFACTS, CHROMIUM, browser, log_in
from tests.conftest import PASSWORD
from tests.pipeline_helpers import LINKS, run_until, states, upload
from tests.test_publisher import BrokenCatalog

OUTAGE = "T2_US_MIT"  # a source site out for the whole run (LINKS[2]'s)

# The most store requests one page load makes (the page, its script and style, the settings,
# the session, and the page's own reads): a bound that does not grow with the store.
MAX_REQUESTS = 15


def nice_top(most: int) -> int:
    """The top of a chart's scale (app.js niceTop): 1, 2 or 5 times a power of ten."""
    power = 10 ** (len(str(max(most, 1))) - 1)
    return next(k * power for k in (1, 2, 5, 10) if k * power >= most)


pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")


@pytest.fixture()
def browser_page():
    # bob is an ordinary user: any member may read; he owns none of the files.
    basic = base64.b64encode(f"bob:{PASSWORD}".encode()).decode()
    with browser(extra_http_headers={"Authorization": f"Basic {basic}"}) as context:
        yield context.new_page()


def cells(page, selector: str) -> dict[str, str]:
    """{first cell: second cell} of the rows of a table."""
    rows = page.locator(f"{selector} tbody tr").all()
    return {
        r.locator("td, th").nth(0).inner_text(): r.locator("td").last.inner_text() for r in rows
    }


def test_pages_show_what_the_documents_say(sim_config, accounts, admin, browser_page):
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    # Every copy on one link fails, and a third link's source is out for the whole run: the
    # links and errors pages have failures to show. Done files are
    # published at once, to a catalog that refuses them for good.
    sim_config = dataclasses.replace(
        sim_config,
        sim=dataclasses.replace(
            sim_config.sim,
            link_failure_rates={"T2_IT_Pisa>T2_DE_DESY": 1.0},
            outages=[{"site": OUTAGE, "start": 0, "end": 3600}],
        ),
        publisher=dataclasses.replace(sim_config.publisher, block_closure_timeout=0),
        store=dataclasses.replace(sim_config.store, stats_db=f"{sim_config.store.files_db}_stats"),
        fts3=dataclasses.replace(sim_config.fts3, monitor_url="https://fts.example/job/{job_id}"),
    )
    init_databases(admin, sim_config)  # the pages' settings, a statistics database of its own
    publish = {"publish": True, "publish_info": {"dataset": "/Prim/alice-pages-v1/USER"}}
    task = "261121_210000:alice_pages"
    ids = upload(accounts, sim_config, 12, users=("alice",), task=task, links=LINKS[:3], **publish)
    db = admin.db(sim_config.store.files_db)
    runners = [Runner(Submitter(sim_config, "sub-p")), Runner(Monitor(sim_config, "mon-p"))]
    run_until(  # a mix of states, then stop
        lambda: states(db, ids)["done"] >= 4 and states(db, ids)["failed_attempt"] >= 2, runners
    )
    publisher = Runner(Publisher(sim_config, "pub-p", catalog=BrokenCatalog(retryable=False)))
    publisher.workset.start()
    publisher.step(wait=False)
    # An instance that stopped beating a while ago: the agents page shows it stale.
    db.put({"_id": model.heartbeat_id("cleaner", "gone-0"), "type": model.HEARTBEAT_TYPE,
            "agent": "cleaner", "instance": "gone-0", "host": "old", "pid": 1,
            "started": time.time() - 7200, "last_seen": time.time() - 3600, "stopped": None,
            "cycles": 3, "totals": {}})  # fmt: skip
    # Files of another task still waiting: a backlog to show.
    later = upload(accounts, sim_config, 3, users=("alice",), task=f"{task}_later",
                   links=LINKS[2:3])  # fmt: skip
    analytics = Analytics(sim_config, "an-p")
    Runner(analytics).step(wait=False)  # the monitoring summaries, up to now
    docs = [d for d in db.get_many(ids + later).values() if d]
    truth = Counter(d["state"] for d in docs)
    page = browser_page
    base = pages_url(sim_config)
    # Each page load's requests to the store: a page reads a handful of documents or key ranges
    # whatever the store holds (the summaries; one view range), never one request per file.
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))

    def loaded(fragment: str, selector: str) -> int:
        requested.clear()
        page.goto(base + fragment)
        page.wait_for_selector(selector)
        page.wait_for_load_state("networkidle")
        return len(requested)

    assert loaded("#overview", "#states") <= MAX_REQUESTS
    shown = cells(page, "#states")
    assert {k: int(v) for k, v in shown.items() if k != "total"} == dict(truth)
    assert int(shown["total"]) == len(docs) == 15
    # The active tasks: what their files did in the window, from the documents' histories.
    columns = ("created", "state:done", "state:failed_attempt", "state:failed", "state:killed",
               "publication:published")  # fmt: skip
    for name in (task, f"{task}_later"):
        events = Counter(
            "created" if h["from"] is None else f"{h['axis']}:{h['to']}"
            for d in docs
            if d["task"] == name
            for h in d["history"]
        )
        row = page.locator(f"#tasks tbody tr[data-task='{name}']")
        assert {
            c.get_attribute("data-column"): int(c.inner_text())
            for c in row.locator("td[data-column]").all()
        } == {c: events[c] for c in columns}
    assert page.locator("#tasks tbody tr").first.get_attribute("data-task") == task  # busiest
    # What ended per hour, from the documents' histories (UTC hours of the epoch timestamps),
    # and the backlog at the end of each hour: the files whose state then was a backlog state.
    ends = ("done", "failed_attempt", "failed", "killed")
    ended: dict[str, Counter] = {}
    done_bytes: Counter = Counter()
    for d in docs:
        for h in d["history"]:
            if h["axis"] == "state" and h["to"] in ends:
                hour = time.strftime("%Y-%m-%dT%H", time.gmtime(h["at"]))
                ended.setdefault(hour, Counter())[h["to"]] += 1
                done_bytes[hour] += d["size"] if h["to"] == "done" else 0

    def backlog_at(end: float) -> int:
        def state_then(doc: dict) -> str | None:
            before = [h["to"] for h in doc["history"] if h["axis"] == "state" and h["at"] < end]
            return before[-1] if before else None

        return sum(state_then(d) in summaries.BACKLOG for d in docs)

    def hourly_table() -> dict[str, dict[str, float]]:
        """Each row's exact figures (the cells show them rounded, in MB/s or kB, MB, ...)."""
        return {
            row.get_attribute("data-hour"): {
                c.get_attribute("data-end"): pytest.approx(float(c.get_attribute("data-value")))
                for c in row.locator("td[data-end]").all()
            }
            for row in page.locator("#hourly tbody tr").all()
        }

    def backlogs() -> dict[str, int]:
        return {
            row.get_attribute("data-hour"): int(row.locator("td[data-backlog]").inner_text())
            for row in page.locator("#hourly tbody tr").all()
        }

    expected_hours = {
        hour: {**{e: c[e] for e in ends}, "throughput": done_bytes[hour] / 3600}
        for hour, c in ended.items()
    }
    expected_backlogs = {
        hour: backlog_at(calendar.timegm(time.strptime(hour, "%Y-%m-%dT%H")) + 3600)
        for hour in ended
    }
    assert hourly_table() == expected_hours
    assert backlogs() == expected_backlogs
    assert int(page.locator("#backlog-now").inner_text()) == backlog_at(float("inf"))
    # One bar per hour and end with files, each as tall as its count; the left axis's top is
    # the tallest hour rounded up to 1, 2 or 5 times a power of ten; a legend names each end.
    bars = page.locator("#hourly-chart rect[data-end]").all()
    drawn = [
        (b.get_attribute("data-bucket"), b.get_attribute("data-end"), b.get_attribute("data-value"))
        for b in bars
    ]
    assert sorted((h, e, int(v)) for h, e, v in drawn) == sorted(
        (h, e, n) for h, c in ended.items() for e, n in c.items() if n
    )
    tallest = max(sum(c.values()) for c in ended.values())
    ticks = [
        float(t.get_attribute("data-value")) for t in page.locator("#hourly-chart .y-tick").all()
    ]
    assert max(ticks) == nice_top(tallest) and min(ticks) == 0
    legend = {t.get_attribute("data-end") for t in page.locator("#hourly-chart .legend").all()}
    assert legend == {*ends, "backlog"}

    # The queues at each hour's end: the files each backlog state held then.
    def queue_at(end: float, state: str) -> int:
        def state_then(doc: dict) -> str | None:
            before = [h["to"] for h in doc["history"] if h["axis"] == "state" and h["at"] < end]
            return before[-1] if before else None

        return sum(state_then(d) == state for d in docs)

    queue_bars = page.locator("#queues-chart rect[data-end]").all()
    assert queue_bars
    for bar in queue_bars:
        hour, state = bar.get_attribute("data-bucket"), bar.get_attribute("data-end")
        end = calendar.timegm(time.strptime(hour, "%Y-%m-%dT%H")) + 3600
        assert int(bar.get_attribute("data-value")) == queue_at(min(end, time.time()), state)
    assert {b.get_attribute("data-end") for b in queue_bars} <= set(summaries.BACKLOG)
    page.screenshot(path=str(ARTEFACTS / "overview.png"), full_page=True)
    page.select_option("#unit", "bytes")  # the same hours in bytes, kept in the address
    page.wait_for_selector("h2:has-text('Ended per hour (bytes)')")
    assert "unit=bytes" in page.evaluate("location.hash")
    page.reload()
    page.wait_for_selector("h2:has-text('Ended per hour (bytes)')")
    assert {h: v["done"] for h, v in hourly_table().items()} == {
        hour: done_bytes[hour] for hour in ended
    }
    page.select_option("#unit", "files")
    page.wait_for_selector("h2:has-text('Ended per hour (files)')")
    assert "unit" not in page.evaluate("location.hash")  # the default is left out
    # Two hours later these hours are closed: the same figures from the hour documents.
    analytics.summaries.clock = lambda: time.time() + 7200
    assert analytics.summaries.step().closed
    page.reload()
    page.wait_for_selector("#hourly")
    assert hourly_table() == expected_hours
    assert backlogs() == expected_backlogs
    assert page.locator("#states tbody tr[data-state='total'] td").inner_text() == "15"
    # A window of days ending today: today's row adds up the same hours.
    page.select_option("#window", "30d")
    page.wait_for_selector("h2:has-text('Ended per day (files)')")
    assert "window=30d" in page.evaluate("location.hash")
    days: dict[str, Counter] = {}
    for hour, c in ended.items():
        days.setdefault(hour[:10], Counter()).update(c)
    assert hourly_table() == {
        day: {**{e: c[e] for e in ends},
              "throughput": sum(done_bytes[h] for h in ended if h[:10] == day) / 86400}
        for day, c in days.items()
    }  # fmt: skip
    page.select_option("#window", "24h")
    page.wait_for_selector("h2:has-text('Ended per hour (files)')")

    page.click("#tasks a")  # → the task: its counts, then every file with its states
    page.wait_for_selector("#files")
    assert page.locator("#files tbody tr").count() == 12
    by_id = {d["_id"]: d for d in docs}
    mine = [d for d in docs if d["task"] == task]
    assert [row.get_attribute("data-id") for row in page.locator("#files tbody tr").all()] == [
        d["_id"] for d in sorted(mine, key=lambda d: (int(d["job_id"]), d["_id"]))
    ]  # jobs in numeric order
    for row in page.locator("#files tbody tr").all():
        doc = by_id[row.get_attribute("data-id")]
        texts = [c.inner_text() for c in row.locator("td").all()]
        assert texts[0:2] == [doc["job_id"], doc["file_type"]]
        assert texts[2] == doc["destination_lfn"].rsplit("/", 1)[1]
        assert int(row.locator("td[data-value]").get_attribute("data-value")) == doc["size"]
        assert texts[4:8] == [doc["state"], doc["cleanup"], doc["publication"],
                              str(len(doc["attempts"]))]  # fmt: skip
        failing = doc["state"] in model.FAILING
        assert (doc["failure_reason"] in texts[9]) if failing else texts[9] == ""
    counts = {
        a.get_attribute("data-state"): int(a.get_attribute("data-count"))
        for a in page.locator("#task-counts tr[data-axis='state'] a").all()
    }
    assert counts == Counter(d["state"] for d in mine)
    page.screenshot(path=str(ARTEFACTS / "task.png"), full_page=True)
    # A state's count filters the list, and the filter is in the address.
    page.click("#task-counts a[data-state='failed_attempt']")
    # The list, filtered (locators, not page functions: the store's CSP allows no eval).
    expect(page.locator("#files tbody tr:not([data-state='failed_attempt'])")).to_have_count(0)
    assert "state=failed_attempt" in page.evaluate("location.hash")
    assert {r.get_attribute("data-id") for r in page.locator("#files tbody tr").all()} == {
        d["_id"] for d in mine if d["state"] == "failed_attempt"
    }
    page.select_option("#state-filter", "")
    expect(page.locator("#files tbody tr")).to_have_count(12)

    done_row = page.locator("#files tbody tr", has_text="done").first
    done_id = done_row.get_attribute("data-id")
    done_row.locator("a").click()  # → the file: its whole history
    page.wait_for_selector("#history")
    history = [[c.inner_text() for c in r.locator("td").all()][1:5]
               for r in page.locator("#history tbody tr").all()]  # fmt: skip
    expected = [[h["axis"], h["from"] or "", h["to"], h["by"]] for h in by_id[done_id]["history"]]
    assert history == expected
    # Its transfer attempts, each job linked to the transfer service's web monitor.
    attempts = by_id[done_id]["attempts"]
    links = page.locator("#attempts tbody tr a.job").all()
    assert [a.get_attribute("href") for a in links] == [
        f"https://fts.example/job/{a['job_id']}" for a in attempts
    ]
    page.screenshot(path=str(ARTEFACTS / "file.png"), full_page=True)

    # overview → links → a link → its task → a file
    assert loaded("#overview", "#states") <= MAX_REQUESTS
    page.click("nav a[href='#links']")
    page.wait_for_selector("#matrix")
    active, failed = ("acquired", "submitted", "kill_requested"), ("failed", "failed_attempt")
    per_link: dict[str, Counter] = {}
    for d in docs:
        per_link.setdefault(f"{d['source']}>{d['destination']}", Counter())[d["state"]] += 1
    for name, c in per_link.items():
        cell = page.locator(f"#matrix td[data-link='{name}']").inner_text()
        expected_cell = f"{c['done']} / {sum(c[s] for s in failed)} / {sum(c[s] for s in active)}"
        assert cell == expected_cell
    worst = [r.get_attribute("data-link") for r in page.locator("#worst tbody tr").all()]
    assert set(worst) == set(per_link) and worst[0] == "T2_IT_Pisa>T2_DE_DESY"
    # Its error classes, as the documents' failed attempts give them.
    classes = Counter(
        a["error_class"]
        for d in docs
        if d["source"] == "T2_IT_Pisa"
        for a in d.get("attempts", [])
        if a.get("outcome") == "failed"
    )
    top = page.locator("#worst tbody tr").first.locator("td").last.inner_text()
    shown = {part.rsplit(" ", 1)[0]: int(part.rsplit(" ", 1)[1]) for part in top.split(", ")}
    assert len(shown) == min(3, len(classes)) and all(classes[c] == n for c, n in shown.items())
    assert min(shown.values()) >= max([n for c, n in classes.items() if c not in shown] or [0])
    page.screenshot(path=str(ARTEFACTS / "links.png"), full_page=True)
    name = sorted(per_link)[0]
    page.click(f"#matrix td[data-link='{name}'] a")
    page.wait_for_selector("#link-tasks")
    on_link = [d for d in docs if f"{d['source']}>{d['destination']}" == name]
    assert cells(page, "#link-tasks") == {
        t: str(n) for t, n in Counter(d["task"] for d in on_link).items()
    }
    assert cells(page, "#link-states") == {
        s: str(n) for s, n in Counter(d["state"] for d in on_link).items()
    }
    page.click("#link-tasks a")
    page.wait_for_selector("#files")
    page.locator("#files tbody tr a").first.click()
    page.wait_for_selector("#history")
    assert page.locator("#history tbody tr").count() >= 1

    # The errors page: failed attempts per link and per class, as the documents' attempts say,
    # each message pattern with sample files that failed that way.
    failed_attempts = [
        (f"{d['source']}>{d['destination']}", a["error_class"], d["_id"], a["ended"])
        for d in docs
        for a in d.get("attempts", [])
        if a.get("outcome") == "failed"
    ]
    assert failed_attempts, "the run was meant to fail on one link"
    assert loaded("#errors", "#error-groups") <= MAX_REQUESTS

    def group_counts() -> dict[str, int]:
        return {
            r.get_attribute("data-group"): int(r.locator("td[data-column='count']").inner_text())
            for r in page.locator("#error-groups tbody tr").all()
        }

    assert group_counts() == Counter(link for link, _, _, _ in failed_attempts)
    # The outage is named: its link, the class its failures fall in, the message.
    outage_link = f"{OUTAGE}>T2_DE_DESY"
    assert group_counts()[outage_link] == sum(link == outage_link for link, *_ in failed_attempts)
    outage_row = page.locator(f"#error-messages tr[data-link='{outage_link}']")
    assert outage_row.get_attribute("data-class") == "connection"
    assert f"simulated outage of {OUTAGE}: connection refused" in outage_row.inner_text()
    messages: Counter = Counter()
    for r in page.locator("#error-messages tbody tr").all():
        key = (r.get_attribute("data-link"), r.get_attribute("data-class"))
        messages[key] += int(r.locator("td[data-column='count']").inner_text())
        for sample in r.locator("a.sample").all():
            doc = by_id[sample.get_attribute("href").removeprefix("#file/")]
            assert f"{doc['source']}>{doc['destination']}" == key[0]
            assert key[1] in {a.get("error_class") for a in doc["attempts"]}
    assert messages == Counter((link, cls) for link, cls, _, _ in failed_attempts)
    page.screenshot(path=str(ARTEFACTS / "errors.png"), full_page=True)
    page.select_option("#group", "class")  # by class, kept in the address
    expect(page.locator("#error-groups th").first).to_have_text("error class")
    assert "group=class" in page.evaluate("location.hash")
    assert group_counts() == Counter(cls for _, cls, _, _ in failed_attempts)
    cls = next(iter(group_counts()))
    page.click(f"#error-groups tr[data-group='{cls}'] a")  # a group is a filter
    expect(page.locator(f"#error-messages tbody tr:not([data-class='{cls}'])")).to_have_count(0)
    assert f"class={cls}" in page.evaluate("location.hash")

    # A link's page: copies and bytes done per hour, its throughput and success rate, as the
    # documents' histories say.
    copied = next(name for name, c in sorted(per_link.items()) if c["done"])
    per_hour: dict[str, list] = {}
    for d in docs:
        if f"{d['source']}>{d['destination']}" != copied:
            continue
        for h in d["history"]:
            if h["axis"] == "state" and h["to"] == "done":
                row = per_hour.setdefault(
                    time.strftime("%Y-%m-%dT%H", time.gmtime(h["at"])), [0, 0]
                )
                row[0] += 1
                row[1] += d["size"]
    assert loaded(f"#link/{quote(copied)}", "#link-hourly") <= MAX_REQUESTS
    shown_hours = {
        r.get_attribute("data-hour"): [
            int(r.locator("td[data-column='done']").inner_text()),
            int(r.locator("td[data-column='bytes']").get_attribute("data-value")),
            float(r.locator("td[data-column='throughput']").get_attribute("data-value")),
            r.locator("td[data-column='success']").inner_text(),
        ]
        for r in page.locator("#link-hourly tbody tr").all()
    }
    assert shown_hours == {
        hour: [n, size, pytest.approx(size / 3600), "100.0 %"]
        for hour, (n, size) in per_hour.items()
    }
    bars = page.locator("#link-chart rect[data-end='throughput']").all()
    assert {b.get_attribute("data-bucket"): float(b.get_attribute("data-value")) for b in bars} == {
        hour: pytest.approx(size / 3600) for hour, (_, size) in per_hour.items()
    }
    page.screenshot(path=str(ARTEFACTS / "link.png"), full_page=True)

    assert loaded("#users", "#users") <= MAX_REQUESTS
    row = page.locator("#users tbody tr[data-user='alice']")
    shown_users = {
        c.get_attribute("data-state"): int(c.inner_text())
        for c in row.locator("td[data-state]").all()
    }
    assert shown_users == {**truth, "total": len(docs)}  # the only user of this database
    copied_bytes = sum(d["size"] for d in docs if d["state"] == "done")
    assert int(row.locator("td[data-column='bytes']").get_attribute("data-value")) == copied_bytes
    page.screenshot(path=str(ARTEFACTS / "users.png"), full_page=True)
    page.click("#users a")  # → alice's page: her files per state and her tasks
    page.wait_for_selector("#user-states")
    assert "#user/alice" in page.evaluate("location.hash")
    assert {k: int(v) for k, v in cells(page, "#user-states").items()} == {
        **truth,
        "total": len(docs),
    }
    assert int(page.locator("#user-summary").get_attribute("data-bytes")) == copied_bytes
    assert {r.get_attribute("data-task") for r in page.locator("#user-tasks tbody tr").all()} == {
        task,
        f"{task}_later",
    }
    page.screenshot(path=str(ARTEFACTS / "user.png"), full_page=True)

    assert loaded("#publication", "#publication-failed") <= MAX_REQUESTS
    pub = Counter(d["publication"] for d in docs)
    assert pub["publication_failed"] >= 4  # every done file, refused for good
    row = page.locator(f"#publication-tasks tbody tr[data-task='{task}']")
    outcomes = Counter(h["to"] for d in docs for h in d["history"] if h["axis"] == "publication")
    assert {
        c.get_attribute("data-state"): int(c.inner_text())
        for c in row.locator("td[data-state]").all()
    } == {e: outcomes[e] for e in ("published", "publication_error", "publication_failed")}
    # The failed block(s), with the files the documents put in them and the catalog's reason.
    failed_docs = [d for d in docs if d["publication"] == "publication_failed"]
    blocks = page.locator("#blocks-failed tbody tr").all()
    assert sum(int(b.locator("td[data-column='files']").inner_text()) for b in blocks) == len(
        failed_docs
    )
    assert all("catalog unavailable: 503" in b.inner_text() for b in blocks)
    assert page.locator("p#blocks-open").inner_text() == "none"  # every done file was tried
    failures = {
        r.get_attribute("data-id"): [c.inner_text() for c in r.locator("td").all()]
        for r in page.locator("#publication-failed tbody tr").all()
    }
    assert failures == {
        d["_id"]: [task, d["job_id"], "publication_failed", "1", "catalog unavailable: 503"]
        for d in docs
        if d["publication"] == "publication_failed"
    }
    failed_hours = Counter(
        time.strftime("%Y-%m-%dT%H", time.gmtime(h["at"]))
        for d in docs
        for h in d["history"]
        if h["axis"] == "publication" and h["to"] == "publication_failed"
    )
    assert {
        r.get_attribute("data-hour"): int(
            r.locator("td[data-end='publication_failed']").inner_text()
        )
        for r in page.locator("#publication-hourly tbody tr").all()
    } == dict(failed_hours)
    page.screenshot(path=str(ARTEFACTS / "publication.png"), full_page=True)

    assert loaded("#agents", "#agents") <= MAX_REQUESTS
    rows = {r.get_attribute("data-instance"): r for r in page.locator("#agents tbody tr").all()}
    assert {"sub-p", "mon-p", "gone-0"} <= set(rows)
    assert rows["gone-0"].get_attribute("class") == "stale"
    assert rows["sub-p"].get_attribute("class") == "alive"
    page.screenshot(path=str(ARTEFACTS / "agents.png"), full_page=True)

    # What is not there is said in words, with the way back.
    assert loaded("#file/no-such-id", "#not-found") <= MAX_REQUESTS
    assert "No file with id no-such-id" in page.locator("#not-found").inner_text()
    page.goto(base + "#nonsense/page")
    page.wait_for_selector("#not-found")
    assert 'no page called "nonsense"' in page.locator("#not-found").inner_text()
    assert page.locator("main a[href='#overview']").count() == 1
    page.goto(base + "#task/no_such_task")
    page.wait_for_selector("#not-found")
    page.screenshot(path=str(ARTEFACTS / "not-found.png"), full_page=True)


def test_a_browser_logs_in_with_a_store_account(sim_config, accounts, admin):
    """No certificate, no credentials: the pages' address shows a login page (not the store's
    401); a wrong password is said so; the right one opens the overview, which stays open on
    reload (the store's session cookie) until the reader logs out."""
    Runner(Analytics(sim_config, "an-login")).step(wait=False)
    with browser() as context:
        page = context.new_page()
        page.goto(pages_url(sim_config) + "#users")
        page.wait_for_selector("form#login")
        assert page.locator("#users").count() == 0  # nothing of the data without a login
        log_in(page, "bob", "not-his-password")
        expect(page.locator("#login-message")).to_contain_text("Not logged in")
        page.screenshot(path=str(ARTEFACTS / "login.png"), full_page=True)
        log_in(page, "bob", PASSWORD)
        page.wait_for_selector("table#users")  # the page asked for, once logged in
        expect(page.locator("#who")).to_contain_text("bob")
        page.reload()
        page.wait_for_selector("table#users")
        page.click("#logout")
        page.wait_for_selector("form#login")
        page.goto(pages_url(sim_config) + "#overview")
        page.wait_for_selector("form#login")


def test_the_pages_database_is_read_only_to_everyone_but_the_admin(sim_config, accounts, admin):
    """The pages' database is public to read (the login page loads before a session exists):
    anonymous readers, users, agents and accounts without a role are refused any write to it;
    an operator (aso-admin, its database admin, as of every ASO database) may change its design
    document but write nothing else; the files database stays closed to anonymous readers."""
    from aso.store import StoreError

    name = sim_config.store.pages_db
    ddoc = admin.db(name).get("_design/pages")
    assert ddoc["aso"]["files_db"] == sim_config.store.files_db
    for who in ("anonymous", "alice", "agent", "stranger", "operator"):
        db = accounts[who].db(name)
        assert db.get("_design/pages")["_id"] == "_design/pages"  # anyone reads the app
        with pytest.raises(StoreError) as refused:
            db.put({"_id": f"planted-by-{who}", "type": "transfer_request"})
        assert refused.value.status in (401, 403), (who, refused.value)
        if who == "operator":
            continue
        with pytest.raises(StoreError) as refused:
            db.put({**ddoc, "aso": {"files_db": "elsewhere"}})  # point the pages elsewhere
        assert refused.value.status in (401, 403), (who, refused.value)
    assert admin.db(name).get("_design/pages")["aso"] == ddoc["aso"]
    # Both stores serve the pages under ASO's Content-Security-Policy (the embedded store's is
    # added by deploy/store/attachments-csp.js): the same rules for the pages everywhere.
    page = requests.get(pages_url(sim_config), timeout=30)
    assert page.status_code == 200 and page.headers["Content-Security-Policy"] == ATTACHMENTS_CSP
    view = requests.get(f"{sim_config.store.url}/{name}/_design/pages", timeout=30)
    assert "Content-Security-Policy" not in view.headers  # the document itself: no attachment
    assert [d["_id"] for d in admin.db(name).all_docs("", "\ufff0")] == ["_design/pages"]
    with pytest.raises(StoreError) as refused:
        accounts["anonymous"].db(sim_config.store.files_db).all_docs("", "\ufff0")
    assert refused.value.status == 401
