"""Is a file at its destination? What a look there found, and what the monitor and the publisher
make of it: a file is recorded `done`, or published, only once it is confirmed there (its size,
and its adler32, the request's), by the transfer service's own checksum comparison or by a look
of ASO's (aso.files). Plain functions over data: the looks themselves are aso.files.Confirmer's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aso.transfer import errors
from aso.transfer.base import DONE, FileStatus

CONFIRMED = "confirmed"  # there, with the request's size and adler32
DIFFERENT = "different"  # missing, or another size or adler32
UNCHECKED = "unchecked"  # the storage could not be asked (down, refusing): an error
UNANSWERED = "unanswered"  # the look has not answered yet (a slow storage, a large file's checksum)

# A copy reported done that is not at the destination, or not the file asked for: the retry
# manager tries it again and fails it for good when it repeats (errors.CHECKSUM's rule).
NOT_DONE_CLASS = errors.CHECKSUM


@dataclass(frozen=True)
class Finding:
    """What a look at one file's destination found; `detail` says it in the storage's words
    ("no such file", "size 12, expected 3000", "adler32 …, expected …", or the error)."""

    verdict: str
    detail: str

    @property
    def confirmed(self) -> bool:
        return self.verdict == CONFIRMED


def found(problem: str | None) -> Finding:
    """The finding of a look that got an answer (aso.files.Files.confirm: None, or what differs)."""
    if problem is None:
        return Finding(CONFIRMED, "there, with the request's size and adler32")
    return Finding(DIFFERENT, problem)


def unchecked(why: str) -> Finding:
    return Finding(UNCHECKED, why)


def unanswered(why: str) -> Finding:
    return Finding(UNANSWERED, why)


# --- the monitor: a transfer the service reports done ---------------------------------------
def needs_a_look(status: FileStatus | None) -> bool:
    """A copy reported done that the service did not verify against the request's adler32
    (FileStatus.verified: FTS3 without verification at the destination, the gfal service
    without verification, the simulator): ASO looks at the destination before it is `done`."""
    return status is not None and status.state == DONE and not status.verified


def awaits_a_look(status: FileStatus, finding: Finding | None) -> bool:
    """A copy reported done whose destination could not be confirmed yet (no look, a look not
    answered yet, or a storage error): neither done nor failed; asked again next cycle."""
    return needs_a_look(status) and (finding is None or finding.verdict in (UNCHECKED, UNANSWERED))


def same_checksum(a: str | None, b: str | None) -> bool:
    def norm(x: str) -> str:
        return x.lower().removeprefix("adler32:").lstrip("0")

    return a is None or b is None or norm(a) == norm(b)


def not_done(doc: Mapping[str, Any], status: FileStatus, finding: Finding | None) -> str | None:
    """Why a copy the service reported done is a failed attempt, or None: it is done. Done
    means at the destination, confirmed: by the service's own comparison with the request's
    adler32 (FileStatus.verified), else by the monitor's look (`finding`). The checksum the
    service reports, if any, must be the request's either way."""
    expected = doc["checksum"]["adler32"]
    if not same_checksum(status.checksum, expected):
        return f"checksum mismatch: destination {status.checksum}, request {expected}"
    if needs_a_look(status) and finding is not None and finding.verdict == DIFFERENT:
        return (
            f"reported done by the transfer service, but {doc['destination_lfn']} at "
            f"{doc['destination']} is not the requested file: {finding.detail}"
        )
    return None


# --- the publisher: a file about to go into the catalog ---------------------------------------
def not_published_reason(doc: Mapping[str, Any], finding: Finding) -> str:
    """The publication error of a file the publisher could not confirm at its destination."""
    where = f"{doc['destination_lfn']} at {doc['destination']}"
    if finding.verdict == UNCHECKED:
        return f"not published yet: {where} could not be checked ({finding.detail})"
    return f"not published: {where} is not the requested file ({finding.detail})"
