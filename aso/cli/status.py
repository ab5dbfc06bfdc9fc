"""`aso status`: a task's files (per job, with counts and an estimated completion), what changed
since a time, or one file's whole story (aso.status). aso/cli/__init__.py registers `status_cmd`."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from aso import status
from aso.cli.common import config_of as _config
from aso.cli.common import utc_time
from aso.store import Database, Server

console = Console()


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown (its links have copied nothing in the last hour)"
    if seconds == 0:
        return "nothing left to copy"
    minutes, secs = divmod(int(seconds + 0.5), 60)
    hours, minutes = divmod(minutes, 60)
    return f"about {hours} h {minutes:02d} min" if hours else f"about {minutes} min {secs:02d} s"


def status_cmd(
    ctx: typer.Context,
    task: Annotated[str | None, typer.Argument(help="Task name.")] = None,
    job: Annotated[str | None, typer.Option(help="Only this job of the task.")] = None,
    since: Annotated[
        float | None,
        typer.Option(help="Only files changed after this time (epoch seconds): for polling."),
    ] = None,
    file: Annotated[
        str | None, typer.Option("--file", help="One file's whole story, by request id.")
    ] = None,
    summary: Annotated[
        bool, typer.Option("--summary", help="Counts and estimate only, no file table.")
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")] = False,
) -> None:
    """The state of a task's files (transfer, cleanup, publication), job by job, with counts
    per state and an estimated completion; or with --file, one file's timeline."""
    config = _config(ctx)
    db = Server.from_config(config).db(config.store.files_db)
    if file is not None:
        _file_story(db, file, json_out, config.fts3.monitor_url)
        return
    if task is None:
        raise typer.BadParameter("give a TASK, or --file ID", param_hint="TASK")
    if since is not None:
        changed = status.changed_since(db, task, since)
        if json_out:
            console.print_json(data={"task": task, "since": since, "files": changed})
            return
        console.print(f"{len(changed)} files of task {task} changed since {utc_time(since)} UTC")
        for f in changed:
            console.print(
                f"{utc_time(f['last_update'])}  job {f['job_id']}  {f['state']}/{f['cleanup']}/"
                f"{f['publication']}  {f['id']}",
                markup=False,
            )
        return
    answer = status.task_status(db, task, job)
    if json_out:
        console.print_json(data=answer.to_json())
        return
    if not answer.exists:
        console.print(status.no_requests(task, job))
        return
    counts = Table("axis", "state", "files", title=f"task {task}" + (f" job {job}" if job else ""))
    for axis, states in answer.counts.items():
        for state, n in sorted(states.items()):
            counts.add_row(axis, state, str(n))
    console.print(counts)
    console.print(f"{answer.on_its_way} files on their way; done: {_duration(answer.eta)}")
    if summary:
        return
    files = Table("job", "type", "state", "cleanup", "publication", "last change (UTC)", "reason")
    for row in answer.files:
        files.add_row(
            row.job_id, row.file_type, row.state, row.cleanup, row.publication,
            utc_time(row.last_update), (row.reason or "")[:80],
        )  # fmt: skip
    console.print(files)


def _file_story(db: Database, doc_id: str, json_out: bool, job_url: str) -> None:
    doc = db.get(doc_id)
    if doc is None or doc.get("type") != "transfer_request":
        if json_out:
            console.print_json(data={"id": doc_id, "events": [], "message": "no such request"})
        else:
            console.print(f"no request {doc_id}")
        raise typer.Exit(1)
    events = status.timeline(doc, job_url)
    if json_out:
        console.print_json(
            data={
                "id": doc_id,
                "task": doc["task"],
                "job_id": doc["job_id"],
                "events": [e.__dict__ for e in events],
            }
        )
        return
    console.print(f"{doc['source_lfn']} → {doc['destination']} {doc['destination_lfn']}")
    table = Table("time (UTC)", "what", "detail")
    for e in events:
        table.add_row(utc_time(e.at), e.what, e.detail[:120])
    console.print(table)
