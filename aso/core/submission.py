"""What the submitter decides, as plain functions over documents: which files are ready
(`ready_to_submit`: `new` ones, and `retry` ones whose cool-off is over), which go now and in
which jobs (`plan_jobs`: files grouped by user, group, role, source and destination; the per-link
and per-site caps on files in flight honoured, since protecting storage is why ASO exists;
inside a link users take turns and each user's files go by priority, then age; at most
`transfer.max_files_per_job` files a job), and the job the transfer service gets for them."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aso import model, sites
from aso.config import Config
from aso.model import IN_FLIGHT, STATE, TO_SUBMIT
from aso.transfer import errors
from aso.transfer.base import FileTransfer, JobRequest


def batches_of(
    plans: list[list[Mapping[str, Any]]], files: int
) -> Iterable[list[list[Mapping[str, Any]]]]:
    """Jobs in batches of about `files` files (a job is never split)."""
    batch: list[list[Mapping[str, Any]]] = []
    count = 0
    for plan in plans:
        batch.append(plan)
        count += len(plan)
        if count >= files:
            yield batch
            batch, count = [], 0
    if batch:
        yield batch


def ready_to_submit(doc: Mapping[str, Any], now: float) -> bool:
    """A file to submit now: `new`, or `retry` with its cool-off over."""
    state = doc[STATE]
    return state in TO_SUBMIT and (state == "new" or (doc.get("retry_after") or 0) <= now)


def deadline_start(doc: Mapping[str, Any]) -> float:
    """Where a request's deadline counts from: its creation, or its owner's last resubmission."""
    resubmitted = [
        h["at"]
        for h in doc.get("history") or []
        if h.get("axis") == STATE and h.get("from") in model.NEVER_COPIED and h.get("to") == "new"
    ]
    return float(max([doc["created"], *resubmitted]))


def past_deadline(doc: Mapping[str, Any], deadline: float, now: float) -> bool:
    """Whether a request was not copied within `deadline` seconds of its creation or last
    resubmission (0: no deadline)."""
    return deadline > 0 and now > deadline_start(doc) + deadline


def deadline_reason(doc: Mapping[str, Any], deadline: float) -> str:
    ends = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(deadline_start(doc) + deadline))
    return (
        f"not copied within its deadline ({deadline:g} s from its creation or resubmission, "
        f"{ends} UTC)"
    )


def link_of(doc: Mapping[str, Any]) -> str:
    return f"{doc['source']}>{doc['destination']}"


def group_of(doc: Mapping[str, Any]) -> tuple[str, str, str, str, str]:
    return (
        doc["user"],
        doc.get("group", ""),
        doc.get("role", ""),
        doc["source"],
        doc["destination"],
    )


@dataclass
class Caps:
    per_link: int
    per_site: dict[str, int]  # site → cap for this instance
    default_site: int
    user_share: float = 1.0  # of each cap, the most one user's files may take

    def site(self, name: str) -> int:
        return self.per_site.get(name, self.default_site)

    def of_user(self, cap: int) -> int:
        """One user's part of `cap`: the rest stays for the other users' files."""
        return max(1, int(cap * self.user_share))


@dataclass
class Busy:
    """Files in transfer per link and per site, and of each user on each."""

    link: Counter[str] = field(default_factory=Counter)
    site: Counter[str] = field(default_factory=Counter)
    user_link: Counter[tuple[str, str]] = field(default_factory=Counter)
    user_site: Counter[tuple[str, str]] = field(default_factory=Counter)

    def add(self, doc: Mapping[str, Any]) -> None:
        link, user = link_of(doc), doc["user"]
        self.link[link] += 1
        self.user_link[user, link] += 1
        for site in (doc["source"], doc["destination"]):
            self.site[site] += 1
            self.user_site[user, site] += 1

    def full_for(self, doc: Mapping[str, Any], caps: Caps) -> str | None:
        """Why `doc` may not start now: "all" (its link or a site is full for everyone),
        "user" (its user's share of one is used up), or None."""
        link, user, ends = link_of(doc), doc["user"], (doc["source"], doc["destination"])
        if self.link[link] >= caps.per_link or any(self.site[s] >= caps.site(s) for s in ends):
            return "all"
        if self.user_link[user, link] >= caps.of_user(caps.per_link) or any(
            self.user_site[user, s] >= caps.of_user(caps.site(s)) for s in ends
        ):
            return "user"
        return None


def caps_for(config: Config, instances: int) -> Caps:
    """This instance's caps: a link is wholly one instance's; a site's cap is shared out."""

    def share(cap: int) -> int:
        return max(1, cap // instances)

    per_site = {
        name: share(site.max_active or config.transfer.max_active_per_site)
        for name, site in config.sites.items()
    }
    return Caps(
        config.transfer.max_active_per_link,
        per_site,
        share(config.transfer.max_active_per_site),
        config.transfer.user_share,
    )


def count_in_flight(docs: Iterable[Mapping[str, Any]]) -> Busy:
    busy = Busy()
    for doc in docs:
        if doc.get(STATE) in IN_FLIGHT:
            busy.add(doc)
    return busy


def fair_order(docs: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Users take turns; each user's files by priority (high first), then age (old first)."""
    by_user: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for doc in docs:
        by_user[doc["user"]].append(doc)
    queues = [
        # The oldest first: the nearest its deadline (transfer.deadline from its creation).
        sorted(files, key=lambda d: (-d.get("priority", 0), d["created"], d["_id"]))
        for _, files in sorted(by_user.items())
    ]
    ordered = []
    while any(queues):
        for queue in queues:
            if queue:
                ordered.append(queue.pop(0))
    return ordered


def plan_jobs(
    new: Sequence[Mapping[str, Any]],
    in_flight: Iterable[Mapping[str, Any]],
    caps: Caps,
    max_files: int,
) -> list[list[Mapping[str, Any]]]:
    """Groups of files to submit now, one group per job: within each link's and site's cap,
    and each user's share of them (round 38: one user's files that could not start had taken a
    link's whole cap, and another's waited until hers left)."""
    busy = count_in_flight(in_flight)
    by_link: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for doc in new:
        by_link[link_of(doc)].append(doc)
    # Links whose oldest file has waited longest go first for the shared site capacity.
    order = sorted(by_link, key=lambda link: min(d["created"] for d in by_link[link]))
    chosen: dict[tuple[str, ...], list[Mapping[str, Any]]] = defaultdict(list)
    for link in order:
        for doc in fair_order(by_link[link]):
            full = busy.full_for(doc, caps)
            if full == "all":
                break
            if full == "user":
                continue  # the other users' files of the link may still go
            busy.add(doc)
            chosen[group_of(doc)].append(doc)
    jobs = []
    for files in chosen.values():
        for start in range(0, len(files), max_files):
            jobs.append(files[start : start + max_files])
    return jobs


def may_have_left_a_copy(doc: Mapping[str, Any]) -> bool:
    """An earlier attempt got as far as copying (it did not fail on an existing destination),
    so whatever is at the destination now is a leftover of ours, whose removal failed with the
    attempt (typically: the destination server was what failed)."""
    return any(
        a.get("error_class") not in (None, errors.DESTINATION_EXISTS)
        for a in doc.get("attempts", [])
    )


def file_transfer(config: Config, doc: Mapping[str, Any]) -> FileTransfer:
    """The copy of one request, as the transfer service gets it (raises SiteError for a site
    this host's catalogue lacks)."""
    return FileTransfer(
        doc["_id"],
        *sites.transfer_urls(
            config, doc["source"], doc["destination"], doc["source_lfn"], doc["destination_lfn"]
        ),
        size=doc["size"],
        adler32=doc["checksum"]["adler32"],
        # Which attempt of the request this copy is: the job table records it (the simulator
        # draws a file's fate from it, so one seed gives the same fates whatever the batching).
        metadata={
            "request_id": doc["_id"],
            "lfn": doc["destination_lfn"],
            "attempt": len(doc.get("attempts") or []),
        },
        ours=may_have_left_a_copy(doc),
    )


def job_request(
    config: Config, key: str, docs: Sequence[Mapping[str, Any]], files: tuple[FileTransfer, ...]
) -> JobRequest:
    """The job of `docs` (whose copies are `files`) under `key`."""
    first = docs[0]
    transfer = config.transfer
    return JobRequest(
        key=key,
        files=files,
        user=first["user"],
        task=first["task"],
        source_site=first["source"],
        destination_site=first["destination"],
        overwrite=transfer.overwrite,
        verify_checksum=transfer.verify_checksum,
        priority=transfer.priority,
        max_time_in_queue=transfer.max_time_in_queue,
        metadata={
            "issuer": "ASO",
            "user": first["user"],
            "task": first["task"],
            "aso_key": key,
            "group": first.get("group", ""),
            "role": first.get("role", ""),
        },
    )
