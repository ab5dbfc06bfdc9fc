"""The monitoring pages (couchapp/pages/_attachments), served by the store itself and driven in
headless Chromium (Debian's, through Playwright): logging in, who may write the pages'
database, a user's pages over many tasks and failures, folded tasks. The pages after a run of
the agents, a test per page: tests/test_pages_run.py."""

from __future__ import annotations

import base64
import dataclasses
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import requests
from playwright.sync_api import expect

from aso import model
from aso.agents.analytics import Analytics
from aso.model import Change
from aso.monitoring import summaries
from aso.provision.designdocs import init_databases, pages_url
from aso.provision.store_check import ATTACHMENTS_CSP
from aso.runtime import Runner
from tests.browser_helpers import ARTEFACTS, CHROMIUM, browser, log_in
from tests.conftest import ENGINE, PASSWORD, sample_request
from tests.test_summaries import check_summaries

# The most store requests one page load makes (the page, its script and style, the settings,
# the session, and the page's own reads): a bound that does not grow with the store.
MAX_REQUESTS = 15


def number(cell) -> float | None:
    """A cell's exact figure (its data-value; the text shows it rounded), None if it has none."""
    value = cell.get_attribute("data-value")
    return float(value) if value else None


pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")


def utc_second(at: float) -> str:
    """As the pages show a time (app.js when())."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at))


@pytest.fixture()
def browser_page():
    # bob is an ordinary user: any member may read; he owns none of the files.
    basic = base64.b64encode(f"bob:{PASSWORD}".encode()).decode()
    with browser(extra_http_headers={"Authorization": f"Basic {basic}"}) as context:
        yield context.new_page()


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


def failed_request(user: str, task: str, at: float, n: int) -> dict[str, Any]:
    """A request of `user` given up at `at` + 4 s after one failed attempt (its n-th failure)."""
    doc, t = sample_request(user, task=task, at=at), at + 1  # submitted 2 s after its creation

    def step(to: str, **fields: Any) -> None:
        nonlocal doc, t
        t += 1
        doc = model.transition(doc, [Change(model.STATE, to, "test")], model.ADMIN, at=t, **fields)

    step("submitted")
    reason = f"gone ({n})"
    attempt = {"job_id": f"job-{n}", "service": "sim", "submitted": t, "ended": t + 1,
               "outcome": "failed", "error_class": "source_missing", "reason": reason}  # fmt: skip
    step("failed_attempt", attempts=[attempt], error_class="source_missing",
         failure_reason=reason)  # fmt: skip
    step("failed")
    return doc


def test_a_user_s_failures_are_paged_from_the_row_s_exact_time(sim_config, admin):
    """EMBEDDED_VIEW_KEYS_INEXACT: the embedded store decodes a view row's key from the index's
    sortable text, and a time of 17 significant digits may come back a unit in the last place
    off; the user page started its next page of failures at that key and, when it was smaller
    than the stored one, skipped the row (the page test's "59 of 60", now and then). The view
    carries the exact time in its value (`at`), which the page starts from: every failure is
    on exactly one page, in order, on both stores; paging by the row's key would have lost
    rows on the embedded store, with these very times."""
    init_databases(admin, sim_config)
    db = admin.db(sim_config.store.files_db)
    # Times to the tenth of a microsecond, as time.time() gives them (one decoded a unit off in
    # a failed run: 1795532316.2118158 came back as ...156).
    times = [1795532316.2118158 + 10 * i + 1.37e-5 * i for i in range(120)]
    docs = [
        failed_request("carol", f"261101_{i:06d}:carol_f", t - 4, i) for i, t in enumerate(times)
    ]
    assert all(r.ok for r in db.bulk_write(docs))
    want = [
        d["_id"] for d in sorted(docs, key=lambda d: (d["last_update"], d["_id"]), reverse=True)
    ]

    def pages(next_from: Callable[[dict[str, Any]], list[Any]]) -> list[list[str]]:
        """The failures 7 a page, newest first, as the page reads them (limit: a page + 1)."""
        seen, start = [], ["carol", {}]
        while True:
            rows = db.view("users", "failures", start_key=start, end_key=["carol"],
                           descending=True, limit=8).rows  # fmt: skip
            seen.append([r["id"] for r in rows[:7]])
            if len(rows) < 8:
                return seen
            start = ["carol", *next_from(rows[7])]

    by_value = pages(lambda row: [row["value"]["at"], row["id"]])
    assert [i for page in by_value for i in page] == want
    assert {d["_id"]: d["last_update"] for d in docs} == {
        r["id"]: r["value"]["at"]
        for r in db.view("users", "failures", start_key=["carol"], end_key=["carol", {}]).rows
    }
    by_key = [i for page in pages(lambda row: row["key"][1:]) for i in page]
    if ENGINE == "pouchdb":  # the store's defect is still there: the test data meets it
        assert len(by_key) < len(want), "keys exact on the embedded store: workaround obsolete?"
    else:
        assert by_key == want


def test_a_user_page_lists_every_task_and_failure_a_page_at_a_time(
    sim_config, accounts, admin, browser_page
):
    """A user's page lists every task of theirs, newest first (not only those active in the
    last 24 hours), 300 rows of (task, state) a page, and their failing files, the last changed
    first, 100 a page: the pages together hold each task and each failure once, with the
    documents' counts, classes and reasons; each page load makes a bounded number of requests."""
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    sim_config = dataclasses.replace(
        sim_config,
        store=dataclasses.replace(sim_config.store, stats_db=f"{sim_config.store.files_db}_stats"),
    )
    init_databases(admin, sim_config)
    db = admin.db(sim_config.store.files_db)
    start = time.time() - 3 * 86400  # older than the 24 hours of "active"
    names = [f"261101_{i:06d}:bob_many" for i in range(160)]  # in the order they were made
    docs = []
    for i, name in enumerate(names):
        docs.append(failed_request("bob", name, start + 10 * i, i))
        docs.append(sample_request("bob", task=name, at=start + 10 * i))  # still waiting
    for chunk in range(0, len(docs), 100):
        assert all(r.ok for r in db.bulk_write(docs[chunk : chunk + 100]))
    Runner(Analytics(sim_config, "an-u")).step(wait=False)
    page, base = browser_page, pages_url(sim_config)
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))

    def load(fragment: str) -> None:
        """A whole page load of `fragment`: its store requests are bounded."""
        page.goto("about:blank")
        requested.clear()
        page.goto(base + fragment)
        page.wait_for_selector("#user-failures")
        page.wait_for_load_state("networkidle")
        assert len(requested) <= MAX_REQUESTS

    def next_page(link: str) -> str | None:
        older = page.locator(link)
        return older.get_attribute("href") if older.count() else None

    by_task = Counter((d["task"], d["state"]) for d in docs)
    failing = sorted((d for d in docs if d["state"] == "failed"),
                     key=lambda d: (d["last_update"], d["_id"]), reverse=True)  # fmt: skip
    tasks_seen: list[list[str]] = []
    failures_seen: list[list[str]] = []
    fragment: str | None = "#user/bob"
    while fragment:  # older tasks, page by page
        load(fragment)
        assert int(page.locator("#user-summary").get_attribute("data-bytes")) == 0
        shown = []
        for r in page.locator("#user-tasks tbody tr").all():
            name = r.get_attribute("data-task")
            shown.append(name)
            assert int(r.locator("td[data-column='files']").inner_text()) == 2
            assert {
                c.get_attribute("data-state"): int(c.inner_text())
                for c in r.locator("td[data-state]").all()
            } == {"failed": by_task[(name, "failed")], "new": by_task[(name, "new")]}
        tasks_seen.append(shown)
        if len(tasks_seen) == 1:
            page.screenshot(path=str(ARTEFACTS / "user-pages.png"), full_page=True)
        fragment = next_page("#tasks-older")
    # 300 rows of two states each: 149 whole tasks (the 150th may be cut short: it begins the
    # next page), then the other 11; newest first, each once.
    assert [len(p) for p in tasks_seen] == [149, 11]
    assert [name for p in tasks_seen for name in p] == names[::-1]
    fragment = "#user/bob"
    while fragment:  # older failures, page by page
        load(fragment)
        rows = page.locator("#user-failures tbody tr").all()
        failures_seen.append([r.get_attribute("data-id") for r in rows])
        by_id = {d["_id"]: d for d in failing}
        for r in rows:
            d = by_id[r.get_attribute("data-id")]
            column = "td[data-column='{}']".format
            assert [r.locator(column(c)).inner_text() for c in ("state", "class", "reason")] == [
                "failed", "source_missing", d["failure_reason"]
            ]  # fmt: skip
            assert r.locator("td").first.inner_text() == utc_second(d["last_update"])
        fragment = next_page("#failures-older")
    assert [len(p) for p in failures_seen] == [100, 60]
    assert [i for p in failures_seen for i in p] == [d["_id"] for d in failing]
    # None of them was active in the last 24 hours: the page lists them all the same.
    assert page.locator("#user-active tbody tr").count() == 0


def test_the_pages_say_when_tasks_were_folded(
    sim_config, accounts, admin, browser_page, monkeypatch
):
    """More tasks active than a summary lists (issue 33: users name their tasks; the summaries
    list TASKS_CAP of them, here 5, each user's 2 latest first): the overview lists the cap,
    says how many more there were and shows their totals as "other tasks"; alice's page shows
    her listed tasks and her own folded ones; the totals are the documents'."""
    monkeypatch.setattr(summaries, "TASKS_CAP", 5)
    monkeypatch.setattr(summaries, "USER_TASKS", 2)
    sim_config = dataclasses.replace(
        sim_config,
        store=dataclasses.replace(sim_config.store, stats_db=f"{sim_config.store.files_db}_stats"),
    )
    init_databases(admin, sim_config)
    now = time.time()
    docs = [sample_request(user, task=f"261121_120000:{user}_fold{i}", at=now - 60 * i)
            for user, n in (("alice", 12), ("bob", 3)) for i in range(n)]  # fmt: skip
    assert all(r.ok for r in admin.db(sim_config.store.files_db).bulk_write(docs))
    Runner(Analytics(sim_config, "an-f")).step(wait=False)
    folded_live = check_summaries(admin.db(sim_config.store.stats_db))
    assert any(d.get(summaries.OTHER_TASKS) for d in folded_live)  # the schema saw folded tasks
    page, base = browser_page, pages_url(sim_config)
    page.goto(base + "#overview")
    page.wait_for_selector("#tasks")
    assert page.locator("#tasks tbody tr[data-task]:not([data-task=''])").count() == 5
    assert page.locator("#tasks-folded").get_attribute("data-tasks") == "10"
    folded = page.locator("#tasks-folded-row td[data-column='created']")
    assert folded.inner_text() == "10"  # each folded task created one file
    page.screenshot(path=str(ARTEFACTS / "tasks-folded.png"), full_page=True)
    page.goto("about:blank")
    page.goto(base + "#user/alice")
    page.wait_for_selector("#user-active")
    listed = page.locator("#user-active tbody tr[data-task]:not([data-task=''])").count()
    assert listed >= 2
    mine = page.locator("#user-active #tasks-folded-row td[data-column='created']")
    assert mine.inner_text() == str(12 - listed)
