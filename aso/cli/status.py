"""`aso status`: a task's files (per job, with counts and an estimated completion), what changed
since a time, or one file's whole story (aso.monitoring.queries). aso/cli/__init__.py registers
`status_cmd`."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import typer

from aso import model
from aso.cli.common import (
    AllOpt,
    LimitOpt,
    UsageError,
    first_rows,
    line_console,
    print_json,
    print_more,
    print_table,
    resolve_id,
    row_limit,
    utc_time,
)
from aso.cli.common import config_of as _config
from aso.core import holds
from aso.monitoring import queries
from aso.store import Database, Server

console = line_console()


def _duration(seconds: float | None, note: str) -> str:
    if seconds is None:
        return f"unknown ({note})"
    if seconds == 0:
        return "nothing left to copy"
    minutes, secs = divmod(int(seconds + 0.5), 60)
    hours, minutes = divmod(minutes, 60)
    return f"about {hours} h {minutes:02d} min" if hours else f"about {minutes} min {secs:02d} s"


FILE_COLUMNS = (
    "id", "job", "type", "state", "cleanup", "publication", "attempts", "last change (UTC)",
    "error", "waiting", "source LFN",
)  # fmt: skip


def waiting_text(waiting: dict[str, Any] | None, job_url: str = "") -> str:
    """One file's `waiting`, as a person reads it: why, since when, until when, behind how
    many on its link, which job (and its page at the transfer service's monitor: `job_url`,
    `fts3.monitor_url`)."""
    if not waiting:
        return ""
    words = [
        model.WAITING_WORDS.get(waiting["why"], waiting["why"]),
        f"since {utc_time(waiting['since'])}",
    ]
    if waiting.get("until"):
        words.append(f"until {utc_time(waiting['until'])}")
    if "link_waiting" in waiting:
        words.append(f"({waiting['link_waiting']} waiting to start on its link, "
                     f"{waiting['link_active']} in transfer)")  # fmt: skip
    if waiting.get("job_id"):
        link = f" {job_url.replace('{job_id}', waiting['job_id'])}" if job_url else ""
        words.append(f"(job {waiting['job_id']}{link})")
    if waiting.get("control"):
        words.append(f"({waiting['control']})")
    if waiting.get("hold"):
        words.append(f"({waiting['hold']})")
    return " ".join(words)


def _file_row(f: queries.FileStatus) -> list[Any]:
    error = f.reason or f.cleanup_error or f.publication_error or f.note or ""
    if f.error_class and f.reason:
        error = f"[{f.error_class}] {f.reason}"
    cleanup, publication = f.cleanup, f.publication
    if f.state in model.NEVER_COPIED:
        # They wait for a copy that only a resubmission (or a job retry) starts.
        cleanup, publication = (f"{v} (no copy)" if v == "pending" else v
                                for v in (cleanup, publication))  # fmt: skip
    return [
        f.id[:12], f.job_id, f.file_type, f.state, cleanup, publication, f.attempts,
        utc_time(f.last_update), error, waiting_text(f.waiting), f.source_lfn,
    ]  # fmt: skip


def status_cmd(
    ctx: typer.Context,
    task: Annotated[str | None, typer.Argument(help="Task name.")] = None,
    job: Annotated[str | None, typer.Option(help="Only this job of the task.")] = None,
    since: Annotated[
        str | None,
        typer.Option(
            help="Only files changed after this store sequence: the `seq` an earlier answer "
            "printed (0: every file). For polling; it never misses a change.",
        ),
    ] = None,
    file: Annotated[
        str | None,
        typer.Option("--file", help="One file's whole story, by request id (or its start)."),
    ] = None,
    summary: Annotated[
        bool, typer.Option("--summary", help="Counts and estimate only, no file table.")
    ] = False,
    limit: LimitOpt = None,
    show_all: AllOpt = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")] = False,
) -> None:
    """The state of a task's files (transfer, cleanup, publication), job by job, with counts
    per state and an estimated completion; or with --file, one file's timeline.

    Rows (files, or a file's events): at most --limit, then how many more."""
    config = _config(ctx)
    db = Server.from_config(config).db(config.store.files_db)
    wanted = row_limit(limit, show_all, json_out)
    if file is not None:
        _file_story(db, resolve_id(db, file), json_out, config.fts3.monitor_url, wanted)
        return
    if task is None:
        raise UsageError("give a TASK, or --file ID")
    if since is not None:
        _changes(db, task, since, json_out, wanted)
        return
    answer = queries.task_status(db, task, job)
    files = first_rows(answer.files, wanted)
    if json_out:
        data = answer.to_json()
        data.update(total=len(answer.files), files=data["files"][: len(files)])
        print_json(console, data)
        print_more(len(answer.files), len(files), json_out=True)
        return
    if not answer.exists:
        console.print(queries.no_requests(task, job))
        return
    title = f"task {task}" + (f" job {job}" if job else "")
    rows = [
        (axis, state, n)
        for axis, states in answer.counts.items()
        for state, n in sorted(states.items())
    ]
    print_table(("axis", "state", "files"), rows, title=title)
    if answer.finished:
        print(f"finished: every file of the {'job' if job else 'task'} is final")
    else:
        eta = _duration(answer.eta, answer.eta_note)
        print(f"{answer.on_its_way} files on their way; done: {eta}; not final yet: "
              f"{answer.unfinished}")  # fmt: skip
    if waiting := queries.waiting_counts(answer.files):
        reasons = "; ".join(f"{n} {model.WAITING_WORDS[why]}" for why, n in sorted(waiting.items()))
        print(f"waiting: {reasons}")
    for says, n in sorted(answer.held_back.items()):
        print(f"{n} files held back, not started until an operator allows it: {says}")
    for says, n in sorted(answer.held.items()):
        if says.startswith(holds.NO_ANSWER):  # a site's hold: operators' to end
            print(f"{n} files held ({says}): they go once the site answers a look again")
            continue
        print(f"{n} files held ({says}): they go once the destination passes a look; "
              "`aso hold release SITE` tries now, `aso hold cancel SITE` fails them")  # fmt: skip
    stopped = sum(answer.counts.get("state", {}).get(s, 0) for s in model.NEVER_COPIED)
    if stopped:
        print(
            f"{stopped} files failed or were killed: `aso resubmit --task {task}` queues them "
            "again; `aso status --file ID` tells why each one stopped"
        )
    if not summary:
        print_table(FILE_COLUMNS, [_file_row(f) for f in files])
        print_more(len(answer.files), len(files))
    print(f"seq {answer.seq}: `aso status {task} --since {answer.seq}` shows what changes next")


def _changes(db: Database, task: str, since: str, json_out: bool, wanted: int | None) -> None:
    """The files changed after `since`. A listing cut by --limit still gives the `seq` of the
    whole answer: the rows left out are seen with a larger --limit from the same `since`."""
    changed, seq = queries.changed_since(db, task, since)
    shown = first_rows(changed, wanted)
    if json_out:
        files = [dataclasses.asdict(f) for f in shown]
        print_json(console, {"task": task, "since": since, "seq": seq, "total": len(changed),
                                 "files": files})  # fmt: skip
        print_more(len(changed), len(shown), json_out=True)
        return
    print_table(FILE_COLUMNS, [_file_row(f) for f in shown],
                title=f"{len(changed)} files of task {task} changed after seq {since}")  # fmt: skip
    print_more(len(changed), len(shown))
    print(f"seq {seq}: `aso status {task} --since {seq}` shows what changes next")


def _file_story(
    db: Database, doc_id: str, json_out: bool, job_url: str, wanted: int | None
) -> None:
    doc = db.get(doc_id)
    if doc is None or doc.get("type") != "transfer_request":
        if json_out:
            print_json(console, {"id": doc_id, "events": [], "message": "no such request"})
        else:
            console.print(f"no request {doc_id}")
        raise typer.Exit(1)
    events = queries.timeline(doc, job_url)
    shown = first_rows(events, wanted)
    row = queries.status_row(db, doc)
    if row is not None:
        queries.held_back_counts(db, [row])  # what holds it back, in its `waiting`
        queries.held_counts(db, [row])
        queries.link_queues(db, [row])
    waiting = row.waiting if row else None
    if json_out:
        print_json(
            console,
            data={
                "id": doc_id,
                "task": doc["task"],
                "job_id": doc["job_id"],
                # What the text's first line says: the copy's source and destination.
                "source_lfn": doc["source_lfn"],
                "destination": doc["destination"],
                "destination_lfn": doc["destination_lfn"],
                "waiting": waiting,
                "total": len(events),
                "events": [e.__dict__ for e in shown],
            },
        )
        print_more(len(events), len(shown), json_out=True)
        return
    print(f"{doc['source_lfn']} → {doc['destination']} {doc['destination_lfn']}")
    print_table(
        ("time (UTC)", "what", "detail"), [(utc_time(e.at), e.what, e.detail) for e in shown]
    )
    print_more(len(events), len(shown))
    if waiting:
        print(f"now: {waiting_text(waiting, job_url)}")
