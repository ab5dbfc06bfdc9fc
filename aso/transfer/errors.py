"""ASO's error classes for failed transfers, from gfal2 error codes and FTS3 reason texts.

The retry manager decides from the class (and the attempt history) whether to try again.
Measured gfal2/XRootD codes: docs/design.md, "Real storage on one machine".
"""

from __future__ import annotations

import errno
import re

SOURCE_MISSING = "source_missing"
DESTINATION_EXISTS = "destination_exists"
PERMISSION = "permission"
QUOTA = "quota"
CHECKSUM = "checksum_mismatch"
CONNECTION = "connection"
TIMEOUT = "timeout"
CANCELED = "canceled"
SERVICE = "service"  # the transfer service itself failed or refused
LOST = "job_lost"  # the service does not know the job any more
UNKNOWN = "unknown"
# An agent could not act on the request at all (a site its configuration lacks, an agent's own
# error): set aside so that it cannot stop the agent again; the reason says why.
UNPROCESSABLE = "unprocessable"
# Not copied within its deadline (transfer.deadline from its creation): given up.
EXPIRED = "expired"

CLASSES = (
    SOURCE_MISSING,
    DESTINATION_EXISTS,
    PERMISSION,
    QUOTA,
    CHECKSUM,
    CONNECTION,
    TIMEOUT,
    CANCELED,
    SERVICE,
    LOST,
    UNKNOWN,
    UNPROCESSABLE,
    EXPIRED,
)
# Trying again cannot help (a checksum mismatch becomes permanent when it repeats: the retry
# manager's call, from the history).
PERMANENT = frozenset(
    {SOURCE_MISSING, DESTINATION_EXISTS, PERMISSION, QUOTA, UNPROCESSABLE, EXPIRED}
)

XROOTD_FILE_SOURCE_MISSING = 3011  # a raw XRootD code gfal2 passes through for file:// sources

_BY_ERRNO = {
    errno.ENOENT: SOURCE_MISSING,
    XROOTD_FILE_SOURCE_MISSING: SOURCE_MISSING,
    errno.EEXIST: DESTINATION_EXISTS,
    errno.EACCES: PERMISSION,
    errno.EPERM: PERMISSION,
    errno.EDQUOT: QUOTA,
    errno.ENOSPC: QUOTA,
    errno.EILSEQ: CHECKSUM,
    errno.ECONNREFUSED: CONNECTION,
    errno.EHOSTDOWN: CONNECTION,
    errno.EHOSTUNREACH: CONNECTION,
    errno.ENETUNREACH: CONNECTION,
    errno.ECONNRESET: CONNECTION,
    errno.ESTALE: TIMEOUT,
    errno.ETIMEDOUT: TIMEOUT,
    errno.ECANCELED: CANCELED,
}

# Reason texts (FTS3 and gfal2 messages), checked in order: the first match wins.
_BY_TEXT = [
    (
        re.compile(r"checksum (mismatch|do not match|doesn't match)|CHECKSUM MISMATCH", re.I),
        CHECKSUM,
    ),
    (re.compile(r"no such file|not found|HTTP 404|ENOENT|does not exist", re.I), SOURCE_MISSING),
    (re.compile(r"file exists|DESTINATION EXISTS|EEXIST|already exists", re.I), DESTINATION_EXISTS),
    (
        re.compile(r"permission denied|EACCES|HTTP 403|forbidden|not authori[sz]ed|HTTP 401", re.I),
        PERMISSION,
    ),
    (re.compile(r"quota|no space left|ENOSPC|EDQUOT|disk full", re.I), QUOTA),
    (re.compile(r"timed? ?out|ETIMEDOUT|ESTALE|operation expired|deadline", re.I), TIMEOUT),
    (
        re.compile(
            r"connection refused|ECONNREFUSED|EHOSTDOWN|host (is )?down|unreachable|"
            r"connection reset|could not connect|couldn't connect",
            re.I,
        ),
        CONNECTION,
    ),
    (re.compile(r"cancel", re.I), CANCELED),
]


# A server that stopped answering, as gfal2's HTTP plugin reports it from the step before a
# copy: "[13] DESTINATION OVERWRITE ... SSL handshake failed: Connection timed out during SSL
# handshake". The code says permission (permanent); the text says the server did not answer.
_TRANSPORT_UNDER_PERMISSION = (TIMEOUT, CONNECTION)


def classify(code: int | None = None, message: str | None = None) -> str:
    """The error class of a failure, from an error code (gfal2.GError.code) and/or a text."""
    if code in (errno.EACCES, errno.EPERM) and message:
        for pattern, error_class in _BY_TEXT:
            if error_class in _TRANSPORT_UNDER_PERMISSION and pattern.search(message):
                return error_class
    if code is not None and code in _BY_ERRNO:
        # gfal2 reports a missing source of a checksum-verified copy as EIO with a text, and a
        # refused connection over HTTP as EHOSTDOWN: the code first, the text when it is vague.
        return _BY_ERRNO[code]
    for pattern, error_class in _BY_TEXT:
        if message and pattern.search(message):
            return error_class
    return UNKNOWN


def is_permanent(error_class: str | None) -> bool:
    return error_class in PERMANENT


# Which end of a copy a failure names: gfal2 and FTS3 prefix the step ("SOURCE CHECKSUM",
# "DESTINATION OVERWRITE", "... (destination)"); the simulator names the site.
_SOURCE_SAYS = re.compile(r"\bSOURCE\b|\(source\)")
_DESTINATION_SAYS = re.compile(r"\bDESTINATION\b|\(destination\)")


def failing_end(reason: str | None, source: str, destination: str) -> str | None:
    """The site a failure's reason blames, `source` or `destination`; None when it names
    neither or both (a failure of the copy itself, or of the service)."""
    text = reason or ""
    by_step = {source: bool(_SOURCE_SAYS.search(text)),
               destination: bool(_DESTINATION_SAYS.search(text))}  # fmt: skip
    if by_step[source] != by_step[destination]:
        return source if by_step[source] else destination
    named = [site for site in (source, destination) if re.search(rf"\b{re.escape(site)}\b", text)]
    return named[0] if len(named) == 1 else None
