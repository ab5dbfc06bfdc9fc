"""The transfer request: its schema, its deterministic id and its state machine.

This module is the one description of a request. Python code (upload client, agents) uses it
directly; the store's `validate_doc_update` (couchapp/asyncstageout/validate_doc_update.js) reads
the same tables, which `aso db init` serialises into the design document as `lib/model`
(see `validation_model()`). A test drives every (from, to) pair of every axis through the real
store and checks that the store and this module agree.

A request has three state axes, because a finished copy is then cleaned and published
independently, by different agents:

* ``state``       the copy itself:  new → submitted → done, with failed attempts,
                  retries, permanent failure and the user's kill;
* ``cleanup``     the temporary copy at the source, acted upon once ``state`` is done;
* ``publication`` the catalog entry, acted upon once ``state`` is done.

Every change of an axis appends one entry to ``history``: {axis, from, to, at, by}, ``at`` in UTC
epoch seconds, ``by`` the user or agent instance that made it.
"""

from __future__ import annotations

import copy
import hashlib
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aso import jsvalues as js

SCHEMA_VERSION = 1
REQUEST_TYPE = "transfer_request"
HEARTBEAT_TYPE = "heartbeat"

# Roles as validate_doc_update sees them (derived from userCtx by `role_of`).
ADMIN = "admin"
AGENT = "agent"
OWNER = "owner"
ADMIN_ROLES = ("_admin", "aso-admin")
AGENT_ROLE = "aso-agent"
USER_ROLE = "aso-user"

STATE = "state"
CLEANUP = "cleanup"
PUBLICATION = "publication"
AXES = (STATE, CLEANUP, PUBLICATION)

# --- states ----------------------------------------------------------------------------------
STATES: dict[str, tuple[str, ...]] = {
    STATE: (
        "new",  # waiting for the submitter
        "submitted",  # with the transfer service, under the job the document names (the
        # submitter writes it just before its call, with a lease: the monitor releases the
        # file if the service never got the job)
        "done",  # copied and verified at the destination
        "failed_attempt",  # an attempt failed; the retry manager decides what next
        "retry",  # cooling off until `retry_after`; then the submitter takes it as it takes new
        "failed",  # given up: permanent error or out of attempts
        "kill_requested",  # the user asked to kill a file that is in flight
        "killed",  # killed by the user
    ),
    CLEANUP: (
        "pending",  # a temporary copy exists at the source (removed once state is done)
        "cleaned",  # the temporary copy was deleted after the destination was confirmed
        "cleanup_error",  # the last deletion failed; the cleaner retries
        "not_needed",  # no temporary copy (the file was created already at its destination)
    ),
    PUBLICATION: (
        "not_required",  # publish is false, or a log file
        "pending",  # waits for a block
        "published",  # in the catalog
        "publication_error",  # the last publication failed; retried up to a limit
        "publication_failed",  # given up; the user may reset it to pending
    ),
}

# The final value of each axis (used for purging and for "is this request finished").
FINAL: dict[str, tuple[str, ...]] = {
    STATE: ("done", "failed", "killed"),
    CLEANUP: ("cleaned", "not_needed"),
    PUBLICATION: ("not_required", "published", "publication_failed"),
}
# A copy still on its way: every state of the state axis that is not final (the backlog of the
# pages, the metrics and `aso status`).
ON_ITS_WAY: tuple[str, ...] = tuple(s for s in STATES[STATE] if s not in FINAL[STATE])
# The named subsets every module uses; no other module spells a subset of states out.
AT_THE_SERVICE = ("submitted", "kill_requested")  # a job at the transfer service carries the file
BEFORE_A_JOB = ("new", "retry")  # no job carries it (set aside before one is made)
# The submitter's queue: new files, and failed ones whose cool-off is over (`retry_after`).
TO_SUBMIT = ("new", "retry")
IN_FLIGHT = AT_THE_SERVICE  # counted against the link and site caps
CLEANUP_DUE = ("pending", "cleanup_error")  # a temporary copy still to delete
PUBLICATION_DUE = ("pending", "publication_error")  # the publisher's to finish
IN_A_BLOCK = ("published",)  # the file's block is recorded in its document
AFTER_AN_ERROR = ("cleanup_error", "publication_error")  # the document carries the last error
STOPPED = ("failed_attempt", "killed")  # an attempt that ended without the file copied
# Final states without a copy: nothing to clean or publish; the owner may resubmit them.
NEVER_COPIED = ("failed", "killed")
PUBLICATION_FAILURES = ("publication_error", "publication_failed")  # failed, or given up
# States in which a request's failure_reason and error_class are its current failure (status
# rows show them; once the file is copied again, or resubmitted, they are history).
FAILING = ("failed_attempt", "retry", "failed", "killed")
# The groups of states the monitoring pages show (the design document's `aso.states`).
PAGES_STATES: dict[str, tuple[str, ...]] = {
    "on_its_way": ON_ITS_WAY,  # the backlog
    "in_flight": IN_FLIGHT,
    "failing": ("failed", "failed_attempt"),
    # Per hour, files and attempts apart: each file ends once (done, failed for good, killed);
    # an attempt that failed is counted on its own (a file given up after two failed attempts
    # is 2 failed attempts and 1 failed file).
    "file_ends": FINAL[STATE],
    "attempt_failures": ("failed_attempt",),
    "current_failures": FAILING,  # a user's failing files, with their current failure
    "publication_ends": ("published", *PUBLICATION_FAILURES),
    "publication_failures": PUBLICATION_FAILURES,  # failed blocks
}
RAN_TO_AN_END = ("done", "failed")  # outcomes of an attempt whose copy ran (not cancelled)
# Why a file that is not finished waits: the status row's `waiting.why` (docs/status-api.md,
# "Why a file waits"), by its `state` while the copy is on its way, then, once it is `done`, by
# its publication and then its cleanup while they are due (with the `*_retry_after` of their
# errors as `until`). `aso status` tells a queued file an operator's control holds back apart.
WAITING_WHY: dict[str, dict[str, str]] = {
    STATE: {
        "new": "queued",  # for the submitter: its link's and sites' caps, the users' turns
        "retry": "cool_off",  # a failed attempt's cool-off, until `retry_after`; then queued
        "failed_attempt": "deciding",  # the retry manager decides: try again or give up
        "submitted": "at_service",  # at the transfer service, in the job `job_id`
        "kill_requested": "cancelling",  # its owner killed it: the monitor cancels it there
    },
    PUBLICATION: {
        "pending": "block",  # for its block: full, or its oldest file waited long enough
        "publication_error": "publication_retry",  # until `publication_retry_after`
    },
    CLEANUP: {
        "pending": "cleanup",  # its temporary copy, for the cleaner to delete
        "cleanup_error": "cleanup_retry",  # until `cleanup_retry_after`
    },
}
HELD_BACK = "held_back"  # a queued file an operator's control holds back
HELD = "held"  # a file its destination refused for room or permission (aso/core/holds.py)
# How each reads, in `aso status` and on the pages (the pages' design document carries it); no
# "," or ";" (`aso status` lists them with those).
WAITING_WORDS: dict[str, str] = {
    "queued": "queued for its link",
    HELD_BACK: "held back by an operator",
    HELD: "held: its destination has no room or permission for it or a site does not answer",
    "cool_off": "cooling off after a failed attempt",
    "deciding": "failed an attempt: the retry manager decides what next",
    "at_service": "at the transfer service",
    "cancelling": "being cancelled",
    "block": "copied and waiting for its block to be published",
    "publication_retry": "copied and its publication tried again after a failure",
    "cleanup": "copied and its temporary copy to be deleted",
    "cleanup_retry": "copied and the deletion of its temporary copy tried again",
}

# The agents' work (the queue view couchapp/queue/views/work/map.js, which `aso db init` writes
# this table into, and aso/workqueue.py): a request is work of kind K when each axis WORK[K]
# names holds one of its values. Finished requests are nobody's work.
WORK: dict[str, dict[str, tuple[str, ...]]] = {
    # The submitter: a `retry` once its cool-off is over (`retry_after`), submitted from there
    # (earlier retry managers wrote it back to `new` first: a write per failure).
    "submit": {STATE: TO_SUBMIT},
    "active": {STATE: AT_THE_SERVICE},  # the monitor
    "decide": {STATE: ("failed_attempt",)},  # the retry manager
    # The cleaner, once the file's publication is over: the publisher cleans the files it
    # publishes in the same write (one write for both axes instead of two).
    "clean": {STATE: ("done",), CLEANUP: CLEANUP_DUE, PUBLICATION: FINAL[PUBLICATION]},
    "publish": {STATE: ("done",), PUBLICATION: PUBLICATION_DUE},  # the publisher
    # The cleaner, `cleaner.failed_grace` after the file failed for good or was killed (key:
    # since when, state_since): its temporary copy is discarded.
    "discard": {STATE: NEVER_COPIED, CLEANUP: CLEANUP_DUE},
}

# Transitions other than on the `state` axis are only legal while `state` is one of these: a
# copied file's publication and cleanup; the temporary copy of a file never copied, discarded
# once `cleaner.failed_grace` has passed.
AXIS_REQUIRES_STATE: dict[str, tuple[str, ...] | None] = {
    STATE: None,
    CLEANUP: ("done", *NEVER_COPIED),
    PUBLICATION: ("done",),
}

_O, _A = frozenset({OWNER}), frozenset({AGENT})

# (from, to) → roles allowed to make the change. Admins may make any change of any axis.
TRANSITIONS: dict[str, dict[tuple[str, str], frozenset[str]]] = {
    STATE: {
        # submitter: its intent and the attempt in one write, before the job goes to the
        # service under the job key and id the lease and `transfer` name
        ("new", "submitted"): _A,
        ("new", "failed_attempt"): _A,  # a file no job can be made of, set aside at once
        ("retry", "submitted"): _A,  # its cool-off over, the next attempt
        ("retry", "failed_attempt"): _A,  # set aside, as from new
        ("submitted", "new"): _A,  # lease over and the service never got the job
        ("submitted", "done"): _A,  # monitor: copied and verified
        ("submitted", "failed_attempt"): _A,  # the attempt failed, the job was refused or lost
        ("failed_attempt", "retry"): _A,  # retry manager: try again after a cool-off
        ("failed_attempt", "failed"): _A,  # retry manager: permanent error / out of attempts
        ("retry", "new"): _A,  # earlier retry managers: cool-off over
        # submitter: a hold cancelled or past its deadline fails the files it held
        ("new", "failed"): _A,
        ("retry", "failed"): _A,
        ("kill_requested", "killed"): _A,  # monitor: cancelled at the service
        ("kill_requested", "done"): _A,  # the copy finished before the cancel took effect
        ("new", "killed"): _O,  # nothing in flight: the user's kill is immediate
        ("retry", "killed"): _O,
        ("failed_attempt", "killed"): _O,
        ("submitted", "kill_requested"): _O,  # in flight: an agent cancels, then kills
        ("failed", "new"): _O,  # resubmission
        ("killed", "new"): _O,
    },
    CLEANUP: {
        ("pending", "cleaned"): _A,
        ("pending", "cleanup_error"): _A,
        ("cleanup_error", "cleaned"): _A,
    },
    PUBLICATION: {
        ("pending", "published"): _A,  # the catalog holds it (the catalog is the record)
        ("pending", "publication_error"): _A,
        ("publication_error", "pending"): _A,  # the backoff is over: waits for a block again
        ("publication_error", "publication_failed"): _A,
        # a publication that trying again cannot heal (a claim the destination disproves, a
        # catalog's lasting refusal): failed in one write, which the owner may reset
        ("pending", "publication_failed"): _A,
        ("publication_failed", "pending"): _O,  # `aso publish --retry`: the user resets it
    },
}

# What a request may be created as (by its owner; admins may create any valid document): per
# creation `state`, the `cleanup` and `publication` it may start with. A file to copy is `new`
# with its temporary copy `pending`; a file the job wrote at its destination already is `done`
# with nothing to clean. Either starts its publication `pending` (or `not_required`): a request
# is never born cleaned, published or on its way to the catalog (a user had created requests
# `done`/`cleaned` and `done`/`not_needed`/`published`).
CREATION: dict[str, dict[str, tuple[str, ...]]] = {
    "new": {CLEANUP: ("pending",), PUBLICATION: ("pending", "not_required")},
    "done": {CLEANUP: ("not_needed",), PUBLICATION: ("pending", "not_required")},
}

# Fields an owner's update may change: the axes (whose changes the transition table rules) and
# the history entry recording the change.
OWNER_MUTABLE = (*AXES, "history", "last_update")
# What a job retry brings anew under the same LFN: its owner renews a request that was never
# copied (failed or killed) with the new file's, as it resubmits it (docs/status-api.md, "Job
# retries"); the validation allows exactly this.
RENEWABLE = ("job_retry", "size", "checksum", "publish_info")
# What a renewal also moves back, beside its state to `new`, and nothing else may: the
# temporary copy the cleaner discarded after the failure is the job retry's new file.
RENEWAL_MOVES: dict[str, tuple[str, str]] = {CLEANUP: ("cleaned", "pending")}
# The fields whose values must lie in their owner's namespace (below): only a creation or a
# renewal (RENEWABLE) sets them, and whoever does is judged by the owner's namespace.
NAMESPACED = ("source_lfn", "destination_lfn", "publish_info")
# Fields fixed at creation: nobody but an admin changes them afterwards (but RENEWABLE, above).
IMMUTABLE = (
    "type",
    "schema",
    "user",
    "user_dn",
    "group",
    "role",
    "task",
    "job_id",
    "job_retry",
    "file_type",
    "source",
    "destination",
    "source_lfn",
    "destination_lfn",
    "size",
    "checksum",
    "publish",
    "publish_info",
    "created",
)

# --- namespaces ------------------------------------------------------------------------------
# CMS's conventions, which the store enforces when a user creates a request (alice had
# written into bob's area, copied and had the cleaner delete bob's temporary output, and put her
# file in bob's dataset). A user <name> stages out from /store/temp/user/<name>/ or
# /store/temp/user/<name>.<hash>/, writes under /store/user/<name>/, and publishes into
# /<primary>/<name>-<processed>/USER. A group area /store/group/<group>/ (and datasets
# /<primary>/<group>-<processed>/USER) needs the role group:<group>, which only the grid-mapfile
# grants. <name> is the user the front end mapped from the certificate (userCtx.name). The
# separators decide ownership: /store/temp/user/<x>.<hash>/ is <x>'s and /<p>/<x>-<rest>/USER is
# <x>'s, <x> ending at the first "." or "-": a name that holds one owns no such area or dataset
# (user "alice-bob" would otherwise share alice's datasets). The store judges every write that
# sets a namespaced field (NAMESPACED): a creation, or its owner's renewal.
TEMP_USER_AREA = "/store/temp/user/"
USER_AREA = "/store/user/"
GROUP_AREA = "/store/group/"
GROUP_ROLE = "group:"
TEMP_HASH_PATTERN = r"^\.[A-Za-z0-9_-]{1,64}/"  # the `.<hash>` of /store/temp/user/<name>.<hash>/
GROUP_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"


# --- schema ----------------------------------------------------------------------------------
# A field spec: {"type": name or [names], plus limits}. Types: string, integer, number, boolean,
# object (with "fields"/"required", or free with "values"; "max_chars" bounds it as JSON), array
# (with "items"), null.
# Patterns are written in the subset of regular expressions that JavaScript and Python share.
MAX_DOC_CHARS = 262_144  # the whole document, as JSON
MAX_STRING = 1024
# An LFN names a file: /store/ then parts separated by single slashes, none empty, none . or ..,
# no trailing slash (a directory such as /store/user/alice/ is no file to copy).
LFN_PATTERN = r"^/store(/(?!\.\.?(/|$))[A-Za-z0-9_.+=:@,-]+)+$"
NAME_PATTERN = r"^[A-Za-z0-9_.@+-]{1,128}$"
SITE_PATTERN = r"^T[0-3]_[A-Za-z0-9]{2,3}_[A-Za-z0-9_-]{1,64}$"
TASK_PATTERN = r"^[A-Za-z0-9_.:+-]{1,200}$"
# /PRIMARY/PROCESSED/USER, both names starting with a letter or a digit (never . or ..).
DATASET_PATTERN = (
    r"^/[A-Za-z0-9][A-Za-z0-9_.-]{0,149}/[A-Za-z0-9][A-Za-z0-9_.-]{0,249}"
    r"/(USER|USER-[A-Za-z0-9_-]+)$"
)
ADLER32_PATTERN = r"^[0-9a-f]{8}$"
DOC_ID_PATTERN = r"^[0-9a-f]{64}$"
JOB_ID_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
# What each pattern means, for people: a refusal names this instead of the regular expression
# (`in_words`; the store's own reasons keep the expression, as validate_doc_update.js has it).
PATTERN_MEANINGS = {
    LFN_PATTERN: (
        "an LFN naming a file: /store/ and parts of letters, digits and _.+=:@,- separated by "
        "single slashes (no empty, . or .. part, no trailing slash)"
    ),
    SITE_PATTERN: "a site name such as T2_CH_CERN",
    TASK_PATTERN: "a task name of up to 200 letters, digits and _.:+-",
    NAME_PATTERN: "a name of up to 128 letters, digits and _.@+-",
    ADLER32_PATTERN: "an adler32 checksum of 8 lower-case hex digits",
    DATASET_PATTERN: (
        "a dataset name /PRIMARY/PROCESSED/USER (PRIMARY and PROCESSED start with a letter or "
        "a digit)"
    ),
    JOB_ID_PATTERN: "a job id of up to 64 letters, digits and _.-",
    DOC_ID_PATTERN: "a request id of 64 lower-case hex digits",
}

_STR = {"type": "string", "max": MAX_STRING}
_NAME = {"type": "string", "pattern": NAME_PATTERN}
_EPOCH = {"type": "number", "min": 0}
_COUNT = {"type": "integer", "min": 0}

HISTORY_ENTRY = {
    "type": "object",
    "required": ["axis", "from", "to", "at", "by"],
    "fields": {
        "axis": {"type": "string", "enum": list(AXES)},
        "from": {"type": ["string", "null"], "max": 64},
        "to": {"type": "string", "max": 64},
        "at": _EPOCH,
        "by": {"type": "string", "max": 200, "min_length": 1},
        "reason": {"type": "string", "max": 4096},
        "until": _EPOCH,  # a `retry` entry: the end of its cool-off (the file's story)
    },
}

ATTEMPT = {
    "type": "object",
    "required": ["job_id", "service", "submitted"],
    "fields": {
        "job_id": {"type": "string", "max": 200},
        "service": {"type": "string", "max": 200},
        "submitted": _EPOCH,
        "ended": {"type": ["number", "null"], "min": 0},
        "outcome": {"type": ["string", "null"], "enum": ["done", "failed", "canceled", None]},
        "reason": {"type": ["string", "null"], "max": 4096},
        "error_class": {"type": ["string", "null"], "max": 64},
        # The fence of a job the service did not know, before the file's next attempt
        # (aso.transfer.base.Fence): no such job can run, or its files had ended there.
        "fenced": {"type": ["string", "null"], "enum": ["absent", "ended", None]},
        # The hold that held it (aso/core/holds.py, its id: hold:SITE:USER or hold:SITE; true
        # from a build before holds were named): the attempt spends nothing of the budget.
        "held": {"type": ["string", "boolean", "null"], "max": 300},
    },
}

# What an owner may write for the catalog (100 files of ~230 KB of parents each made
# a 23 MB block, which CouchDB refused for every block of the publisher's call). A CMS file has
# a handful of parents (an LFN is at most 500 characters in DBS) and its lumis are a few runs of
# lumi sections; each file's entry in a catalog block is bounded by MAX_PUBLISH_INFO_CHARS, so
# a block's size is bounded by its file count (agents/publisher.py also closes it by size).
MAX_PARENTS = 100
MAX_PARENT_CHARS = 500
MAX_LUMI_RUNS = 100
MAX_LUMIS_PER_RUN = 10_000
MAX_PUBLISH_INFO_CHARS = 65_536  # publish_info as JSON

PUBLISH_INFO = {
    "type": "object",
    "required": ["dataset"],
    "max_chars": MAX_PUBLISH_INFO_CHARS,
    "fields": {
        "dataset": {"type": "string", "pattern": DATASET_PATTERN},
        "events": _COUNT,
        "lumis": {
            "type": "object",
            "max_keys": MAX_LUMI_RUNS,
            "values": {"type": "array", "max_items": MAX_LUMIS_PER_RUN, "items": _COUNT},
        },
        "parents": {
            "type": "array",
            "max_items": MAX_PARENTS,
            "items": {"type": "string", "pattern": LFN_PATTERN, "max": MAX_PARENT_CHARS},
        },
    },
}

REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": [
        "type",
        "schema",
        "user",
        "task",
        "job_id",
        "file_type",
        "source",
        "destination",
        "source_lfn",
        "destination_lfn",
        "size",
        "checksum",
        "publish",
        STATE,
        CLEANUP,
        PUBLICATION,
        "created",
        "last_update",
        "history",
    ],
    "fields": {
        "type": {"type": "string", "enum": [REQUEST_TYPE]},
        "schema": {"type": "integer", "enum": [SCHEMA_VERSION]},
        # who
        "user": _NAME,
        "user_dn": {"type": "string", "max": 512},
        "group": {"type": "string", "max": 128},
        "role": {"type": "string", "max": 128},
        # what
        "task": {"type": "string", "pattern": TASK_PATTERN},
        "job_id": {"type": "string", "pattern": JOB_ID_PATTERN},
        "job_retry": _COUNT,
        "file_type": {"type": "string", "enum": ["output", "log"]},
        "source_lfn": {"type": "string", "pattern": LFN_PATTERN, "max": MAX_STRING},
        "destination_lfn": {"type": "string", "pattern": LFN_PATTERN, "max": MAX_STRING},
        "size": _COUNT,
        "checksum": {
            "type": "object",
            "required": ["adler32"],
            "fields": {"adler32": {"type": "string", "pattern": ADLER32_PATTERN}},
        },
        "priority": {"type": "integer", "min": -100, "max_value": 100},
        # where
        "source": {"type": "string", "pattern": SITE_PATTERN},
        "destination": {"type": "string", "pattern": SITE_PATTERN},
        # publication intent
        "publish": {"type": "boolean"},
        "publish_info": PUBLISH_INFO,
        # state machine
        STATE: {"type": "string", "enum": list(STATES[STATE])},
        CLEANUP: {"type": "string", "enum": list(STATES[CLEANUP])},
        PUBLICATION: {"type": "string", "enum": list(STATES[PUBLICATION])},
        "created": _EPOCH,
        "last_update": _EPOCH,
        "history": {"type": "array", "max_items": 500, "items": HISTORY_ENTRY},
        # agents' bookkeeping
        "attempts": {"type": "array", "max_items": 200, "items": ATTEMPT},
        "lease": {
            "type": ["object", "null"],
            "required": ["owner", "until"],
            "fields": {
                "owner": {"type": "string", "max": 200},
                "until": _EPOCH,
                "job_key": {"type": "string", "max": 200},
            },
        },
        "transfer": {
            "type": ["object", "null"],
            "required": ["job_id", "service"],
            "fields": {
                "job_id": {"type": "string", "max": 200},
                "service": {"type": "string", "max": 200},
                "file_id": {"type": ["string", "integer", "null"], "max": 200},
            },
        },
        "retry_after": {"type": ["number", "null"], "min": 0},
        "failure_reason": {"type": ["string", "null"], "max": 4096},
        "error_class": {"type": ["string", "null"], "max": 64},
        "cleanup_attempts": _COUNT,
        "cleanup_retry_after": {"type": ["number", "null"], "min": 0},
        "cleanup_error": {"type": ["string", "null"], "max": 4096},
        # the cleaner's discard of a failed or killed file's temporary copy under way, since:
        # no resubmission or renewal meanwhile (its file would be deleted under it)
        "discarding": {"type": ["number", "null"], "min": 0},
        "publication_block": {"type": ["string", "null"], "max": 512},
        "publication_attempts": _COUNT,
        "publication_retry_after": {"type": ["number", "null"], "min": 0},
        "publication_error": {"type": ["string", "null"], "max": 4096},
    },
}

# --- what an owner records -------------------------------------------------------------------
# The agents' bookkeeping, each field with its value before any agent has acted. A creation by
# its owner carries none of them, or only that value: a lease, a job, an attempt, a cool-off, a
# block or a failure is what agents act on, and nobody forges one at upload. Every other field
# of the schema is what the owner records (OWNER_RECORDED: the upload format,
# upload.judged_request).
BOOKKEEPING: dict[str, Any] = {
    "attempts": [],
    "lease": None,
    "transfer": None,
    "retry_after": None,
    "failure_reason": None,
    "error_class": None,
    "cleanup_attempts": 0,
    "cleanup_retry_after": None,
    "cleanup_error": None,
    "discarding": None,
    "publication_block": None,
    "publication_attempts": 0,
    "publication_retry_after": None,
    "publication_error": None,
}
OWNER_RECORDED = tuple(f for f in REQUEST_SCHEMA["fields"] if f not in BOOKKEEPING)
# A priority orders its user's own files only (users take turns in the submitter's fair share,
# agents/submitter.py fair_order), so an owner loses nothing by having only lower values: an
# owner's request has a priority of at most 0, the default. Above it is an operator's (admins),
# so that no user's file ever outranks another user's, whatever a submitter does with it.
OWNER_MAX_PRIORITY = 0
# The stamps an owner writes (a creation's created, last_update and history entry; an update's
# last_update and entries) are the store's time, give or take: a worker node's clock may run
# minutes ahead, and a document may be sent again through a store outage for up to a day after
# it was stamped (docs/status-api.md: resending the same document is safe). Agents stamp their
# own clocks (they are trusted); admins are not judged.
CLOCK_AHEAD = 900  # seconds (whole: the refusal names them as JavaScript writes numbers)
CLOCK_BEHIND = 86_400


def task_name(user: str, request: str, at: float | None = None) -> str:
    """A task of `user` named as CRAB names them: YYMMDD_HHMMSS:<user>_<request> (UTC)."""
    stamp = time.strftime("%y%m%d_%H%M%S", time.gmtime(now() if at is None else at))
    return f"{stamp}:{user}_{request}"


# An agent instance's heartbeat (written by agents only; `_id` "heartbeat:<agent>:<instance>").
HEARTBEAT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "agent", "instance", "host", "pid", "started", "last_seen"],
    "fields": {
        "type": {"type": "string", "enum": [HEARTBEAT_TYPE]},
        "agent": {"type": "string", "pattern": r"^[a-z][a-z0-9-]{0,63}$"},
        "instance": {"type": "string", "max": 200},
        "host": {"type": "string", "max": 255},
        "pid": _COUNT,
        "started": _EPOCH,
        "last_seen": _EPOCH,
        "stopped": {"type": ["number", "null"], "min": 0},
        "cycles": _COUNT,
        "last_cycle": {
            "type": "object",
            "max_keys": 50,
            "values": {"type": ["number", "string", "null"], "max": 512},
        },
        "totals": {"type": "object", "max_keys": 50, "values": {"type": "number"}},
        "metrics": {"type": ["string", "null"], "max": 300},  # host:port of its /metrics
    },
}
HEARTBEAT_ID_PATTERN = r"^heartbeat:[a-z][a-z0-9-]{0,63}:[^\s]{1,200}$"


def heartbeat_id(agent: str, instance: str) -> str:
    return f"heartbeat:{agent}:{instance}"


# --- operators' controls -----------------------------------------------------------------------
# A site banned or draining (as source, destination or both), or a user banned: one document
# per site or user, written by operators only (the validation refuses anyone else), with the
# current setting and every earlier one (who, when, why). `allow` lifts the last one.
CONTROL_TYPE = "control"
SITE, USER = "site", "user"
BAN, DRAIN, ALLOW = "ban", "drain", "allow"
CONTROL_MODES = {SITE: (BAN, DRAIN, ALLOW), USER: (BAN, ALLOW)}
BOTH, AS_SOURCE, AS_DESTINATION = "both", "source", "destination"
DIRECTIONS = (BOTH, AS_SOURCE, AS_DESTINATION)
MAX_CONTROL_HISTORY = 500
_SETTING_FIELDS: dict[str, Any] = {
    "mode": {"type": "string", "enum": [BAN, DRAIN, ALLOW]},
    "direction": {"type": "string", "enum": list(DIRECTIONS)},
    "reason": {"type": "string", "max": 1024},
    "by": {"type": "string", "max": 200},
    "at": _EPOCH,
}
CONTROL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "kind", "name", "mode", "direction", "reason", "by", "at", "history"],
    "fields": {
        "type": {"type": "string", "enum": [CONTROL_TYPE]},
        "kind": {"type": "string", "enum": [SITE, USER]},
        "name": {"type": "string", "max": 200},
        **_SETTING_FIELDS,
        "history": {
            "type": "array",
            "max_items": MAX_CONTROL_HISTORY,
            "items": {
                "type": "object",
                "required": list(_SETTING_FIELDS),
                "fields": _SETTING_FIELDS,
            },
        },
    },
}
CONTROL_ID_PATTERN = r"^control:(site|user):[^\s]{1,200}$"


def control_id(kind: str, name: str) -> str:
    return f"control:{kind}:{name}"


# --- holds ------------------------------------------------------------------------------------
# A destination that refused a user's files for lack of room or of permission: that user's files
# for it wait held (neither failed nor spending attempts) until the destination passes a check,
# its user or an operator releases or cancels the hold, or its deadline passes. One document per
# destination and user: the retry manager starts it, the hold checker checks the destination
# again on a backoff and releases or expires it; each state kept in its history.
HOLD_TYPE = "hold"
# A user's hold (hold:SITE:USER): the destination refused that user's files.
HOLD_CLASSES = ("quota", "permission")  # aso.transfer.errors.QUOTA, PERMISSION
# A site's hold (hold:SITE, every user's files): the destination stopped answering, for many
# users' attempts at once (a circuit breaker).
SITE_HOLD_CLASSES = ("connection", "timeout")  # aso.transfer.errors.CONNECTION, TIMEOUT
HOLD_ACTIVE, HOLD_RELEASED, HOLD_CANCELLED, HOLD_EXPIRED = (
    "active",
    "released",
    "cancelled",
    "expired",
)
HOLD_STATES = (HOLD_ACTIVE, HOLD_RELEASED, HOLD_CANCELLED, HOLD_EXPIRED)
# A hold that ended so: the files it held fail, with its class and reason.
HOLD_FAILS = (HOLD_CANCELLED, HOLD_EXPIRED)
# What a hold's own user may do to it while it holds: release it (try now) or cancel it (fail
# the files it holds).
HOLD_OWNER_STATES = (HOLD_RELEASED, HOLD_CANCELLED)
MAX_HOLD_HISTORY = 500
# What a hold always has.
HOLD_REQUIRED = (
    "type",
    "site",
    "user",
    "error_class",
    "path",
    "needs",
    "free",
    "since",
    "checks",
    "next_check",
)
# What only the agents and operators change in a hold (its user changes its state entry only):
# `notified` too, the time of the last entry the notifier told (a user resetting it would have
# every entry told again).
HOLD_KEPT_BY_OWNER = (*HOLD_REQUIRED, "notified")
_HOLD_ENTRY: dict[str, Any] = {
    "state": {"type": "string", "enum": list(HOLD_STATES)},
    "reason": {"type": "string", "max": 1024},
    "by": {"type": "string", "max": 200},
    "at": _EPOCH,
}
HOLD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": [
        *HOLD_REQUIRED,
        *_HOLD_ENTRY,
        "history",
    ],
    "fields": {
        "type": {"type": "string", "enum": [HOLD_TYPE]},
        "site": {"type": "string", "pattern": SITE_PATTERN},
        "user": {"type": "string", "pattern": r"^([A-Za-z0-9_.@+-]{1,128})?$"},  # "": a site's
        "error_class": {"type": "string", "enum": [*HOLD_CLASSES, *SITE_HOLD_CLASSES]},
        "path": {"type": "string", "pattern": LFN_PATTERN, "max": 1024},  # the checked directory
        "needs": _COUNT,  # bytes: the largest file it held
        "free": {"type": ["integer", "null"], "min": 0},  # bytes free at the last check
        "since": _EPOCH,
        "checks": _COUNT,
        "next_check": _EPOCH,
        "notified": _EPOCH,  # the notifier: `at` of the last history entry it told
        **_HOLD_ENTRY,
        "history": {
            "type": "array",
            "max_items": MAX_HOLD_HISTORY,
            "items": {"type": "object", "required": list(_HOLD_ENTRY), "fields": _HOLD_ENTRY},
        },
    },
}
HOLD_ID_PATTERN = r"^hold:T[0-3]_[A-Za-z0-9]{2,3}_[A-Za-z0-9_-]{1,64}(:[A-Za-z0-9_.@+-]{1,128})?$"


def hold_id(site: str, user: str = "") -> str:
    """A user's hold of their files at a site, or with no user the site's hold of everyone's."""
    return f"hold:{site}:{user}" if user else f"hold:{site}"


# --- notification subscriptions -------------------------------------------------------------
# A user's subscriptions to notices (`aso notify`): one document per user, `notify:USER`, in the
# notify database (store.notify_db), written by its user or an operator; and the notifier's
# record of the user's finished tasks already told, `told:USER`, written by the agents only.
# Nobody reads another user's: the front end serves a user their own subscription alone (a
# webhook's address is its secret), and the database is no user's otherwise.
SUBSCRIPTION_TYPE = "subscription"
TOLD_TYPE = "notify_told"
# What a user may be told: their holds' events (aso/core/notices.py EVENT_WORDS) and a task of
# theirs whose transfers are all over.
TASK_DONE = "task_done"
NOTICE_EVENTS = ("held", "released", "cancelled", "expired", TASK_DONE)
# Where: a mail through the operator's SMTP server (notify.user_mail), a JSON webhook or a
# Mattermost incoming webhook, each only under an address the operator allows (notify.webhooks).
TARGET_KINDS = ("mail", "webhook", "mattermost")
MAX_TARGETS = 5
MAX_TOLD_TASKS = 1000  # the newest tasks the notifier keeps track of per user
# One address, nothing a mail header or an SMTP command could take for another (no quotes,
# commas, spaces, `%`, line ends).
MAIL_PATTERN = r"^[A-Za-z0-9._+-]{1,64}@[A-Za-z0-9-]{1,63}(\.[A-Za-z0-9-]{1,63}){1,8}$"
# An http(s) address without user info, query, fragment, percent-escapes or dot segments: what
# the operator's allowlist is compared with is what is contacted.
WEBHOOK_PATTERN = (
    r"^https?://[A-Za-z0-9-]{1,63}(\.[A-Za-z0-9-]{1,63}){0,8}"
    r"(:(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}))?"
    r"(/[A-Za-z0-9_~-][A-Za-z0-9._~-]{0,127}){1,12}/?$"
)
NOTIFY_ID_PATTERN = r"^notify:[A-Za-z0-9_.@+-]{1,128}$"
TOLD_ID_PATTERN = r"^told:[A-Za-z0-9_.@+-]{1,128}$"
_TARGET: dict[str, Any] = {
    "type": "object",
    "required": ["kind", "to"],
    "fields": {
        "kind": {"type": "string", "enum": list(TARGET_KINDS)},
        "to": {"type": "string", "max": 512},
    },
}
SUBSCRIPTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "user", "targets", "events", "updated", "by"],
    "fields": {
        "type": {"type": "string", "enum": [SUBSCRIPTION_TYPE]},
        "user": {"type": "string", "pattern": NAME_PATTERN},
        "targets": {"type": "array", "max_items": MAX_TARGETS, "items": _TARGET},
        "events": {
            "type": "array",
            "max_items": len(NOTICE_EVENTS),
            "items": {"type": "string", "enum": list(NOTICE_EVENTS)},
        },
        "updated": _EPOCH,
        "by": {"type": "string", "pattern": NAME_PATTERN},
    },
}
TOLD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "user", "tasks", "updated"],
    "fields": {
        "type": {"type": "string", "enum": [TOLD_TYPE]},
        "user": {"type": "string", "pattern": NAME_PATTERN},
        # task → time its end was seen (0: over before the notifier first looked: never told)
        "tasks": {"type": "object", "values": _EPOCH, "max_keys": MAX_TOLD_TASKS},
        "updated": _EPOCH,
    },
}


def subscription_id(user: str) -> str:
    return f"notify:{user}"


def told_id(user: str) -> str:
    return f"told:{user}"


def notify_model() -> dict[str, Any]:
    """The tables the notify database's validate_doc_update reads (its `lib/model`)."""
    return {
        "subscription_type": SUBSCRIPTION_TYPE,
        "subscription_schema": SUBSCRIPTION_SCHEMA,
        "told_type": TOLD_TYPE,
        "told_schema": TOLD_SCHEMA,
        "notify_id_pattern": NOTIFY_ID_PATTERN,
        "told_id_pattern": TOLD_ID_PATTERN,
        "mail_pattern": MAIL_PATTERN,
        "webhook_pattern": WEBHOOK_PATTERN,
        "max_doc_chars": MAX_DOC_CHARS,
        "max_string": MAX_STRING,
        "max_safe_integer": MAX_SAFE_INTEGER,
        "store_members": list(STORE_MEMBERS),
        "admin_roles": list(ADMIN_ROLES),
        "agent_role": AGENT_ROLE,
        "clock_ahead": CLOCK_AHEAD,
        "clock_behind": CLOCK_BEHIND,
    }


def target_problem(kind: str, to: str) -> str | None:
    """Why a target's address is not one of its kind (None: it is); the store's validation
    judges the same patterns."""
    pattern = MAIL_PATTERN if kind == "mail" else WEBHOOK_PATTERN
    if kind not in TARGET_KINDS:
        return f"{kind!r} is not a kind of target ({', '.join(TARGET_KINDS)})"
    if not re.fullmatch(pattern, to):
        what = "one mail address" if kind == "mail" else "an http(s) address"
        return f"{to[:200]!r} is not {what} (pattern {pattern})"
    return None


# --- errors ----------------------------------------------------------------------------------
class ModelError(ValueError):
    """A document or a change breaks the model; the message names the rule."""


class Refusal(ModelError):
    """validate_doc_update's refusal: `reason` is the store's `forbidden` text, "[rule] ..."."""

    def __init__(self, rule: str, message: str):
        super().__init__(message)
        self.rule, self.message = rule, message

    @property
    def reason(self) -> str:
        return f"[{self.rule}] {self.message}"


class TransitionError(ModelError):
    pass


# --- ids and time ----------------------------------------------------------------------------
def request_id(source_lfn: str) -> str:
    """Deterministic document id: a job that uploads the same file twice creates nothing new."""
    return hashlib.sha256(source_lfn.encode("utf-8")).hexdigest()


def in_words(reason: str) -> str:
    """A schema refusal as people read it: a pattern's meaning instead of its expression."""
    for pattern, meaning in PATTERN_MEANINGS.items():
        reason = reason.replace(f"does not match {pattern}", f"is not {meaning}")
    return reason


def job_order(job_id: str) -> int | str:
    """A job id as the status views order it (couchapp/asyncstageout/views/by_task): digits
    are a number, so jobs sort 1, 2, 10 rather than 1, 10, 2; any other id is text, after all
    the numbers."""
    return int(job_id) if job_id.isascii() and job_id.isdigit() and len(job_id) <= 15 else job_id


def now() -> float:
    """UTC epoch seconds, as every timestamp of the model."""
    return round(time.time(), 3)


# --- schema -----------------------------------------------------------------------------------
# The schema's checks are the store's JavaScript (couchapp/asyncstageout/lib/schema.js), which
# ASO runs before an upload too (aso/provision/storejs.py request_refusal).
MAX_SAFE_INTEGER = js.MAX_SAFE_INTEGER
# The store's own members of a document (they are not the schema's); any other "_" member is
# refused (CouchDB answers 400 to most before validation; `_attachments` reaches it).
STORE_MEMBERS = ("_id", "_rev", "_revisions", "_deleted")
# How a request's id is described when it is not the one it must be.
ID_RULE = "doc._id must be the request id: sha256 of source_lfn"


def doc_chars(doc: Mapping[str, Any]) -> int:
    """A document's size as both sides measure it: its own fields (not the store's `_`
    members, which differ between stores) as JSON.stringify writes them, in UTF-16 units."""
    return js.length(js.stringify({k: v for k, v in doc.items() if not k.startswith("_")}))


# --- roles and transitions -------------------------------------------------------------------
def role_of(user_ctx: Mapping[str, Any], doc: Mapping[str, Any]) -> str | None:
    """The role a store user has on a document, as validate_doc_update derives it."""
    roles = user_ctx.get("roles") or []
    if any(r in roles for r in ADMIN_ROLES):
        return ADMIN
    if AGENT_ROLE in roles:
        return AGENT
    if user_ctx.get("name") and user_ctx.get("name") == doc.get("user"):
        return OWNER
    return None


def may_transition(axis: str, old: str, new: str, role: str) -> bool:
    """True when `role` may move `axis` from `old` to `new` (same value: not a transition)."""
    if old == new:
        return True
    if role == ADMIN:
        return new in STATES[axis]
    return role in TRANSITIONS[axis].get((old, new), frozenset())


def state_since(doc: Mapping[str, Any]) -> float:
    """When the request reached its `state`: its last history entry of that axis (the queue
    view's key of "discard", couchapp/queue/views/work/map.js)."""
    for entry in reversed(doc.get("history") or []):
        if isinstance(entry, Mapping) and entry.get("axis") == STATE:
            at = entry.get("at")
            if isinstance(at, int | float) and not isinstance(at, bool):
                return float(at)
    return float(doc.get("last_update") or 0)


def has_ended(doc: Mapping[str, Any]) -> bool:
    """The file's life is over as its owner sees it: copied, its temporary copy gone and its
    publication over, or never copied (failed, killed: its temporary copy is discarded later,
    `cleaner.failed_grace`)."""
    if doc.get(STATE) in NEVER_COPIED:
        return True
    return all(doc.get(axis) in FINAL[axis] for axis in AXES)


def is_final(doc: Mapping[str, Any]) -> bool:
    """Nothing more will happen to this request: it may be purged by analytics. A file never
    copied is final once its temporary copy is gone (a purged request would leave it behind,
    named by nothing)."""
    if doc.get(STATE) in NEVER_COPIED:
        return doc.get(CLEANUP) in FINAL[CLEANUP]
    return has_ended(doc)


@dataclass(frozen=True)
class Change:
    axis: str
    to: str
    by: str
    reason: str | None = None


def transition(
    doc: Mapping[str, Any],
    changes: Iterable[Change],
    role: str,
    *,
    at: float | None = None,
    renewal: bool = False,
    **fields: Any,
) -> dict[str, Any]:
    """A copy of `doc` with the changes applied, history appended and `fields` set; in an
    owner's `renewal`, RENEWAL_MOVES are legal too.

    Raises TransitionError when `role` may not make one of the changes, exactly as the store
    would refuse it; callers write the result back with the revision they read.
    """
    stamp = now() if at is None else at
    new = copy.deepcopy(dict(doc))
    for change in changes:
        old_value: Any = new.get(change.axis)  # any JSON value, or None when missing
        if change.axis not in AXES or change.to not in STATES[change.axis]:
            raise TransitionError(f"{change.axis} has no state {change.to!r}")
        renewing = (
            renewal
            and role == OWNER
            and RENEWAL_MOVES.get(change.axis)
            == (
                old_value,
                change.to,
            )
        )
        if not renewing and not may_transition(change.axis, old_value, change.to, role):
            raise TransitionError(
                f"{role} may not change {change.axis} from {old_value} to {change.to}"
            )
        required = AXIS_REQUIRES_STATE[change.axis]
        if required and new.get(STATE) not in required and role != ADMIN and not renewing:
            raise TransitionError(
                f"{change.axis} may only change while state is {' or '.join(required)}"
            )
        entry = {
            "axis": change.axis,
            "from": old_value,
            "to": change.to,
            "at": stamp,
            "by": change.by,
        }
        if change.reason:
            entry["reason"] = change.reason[:4096]
        new[change.axis] = change.to
        new.setdefault("history", []).append(entry)
    new.update(fields)
    new["last_update"] = stamp
    return new


# --- construction ----------------------------------------------------------------------------
def request_of(
    *,
    user: str,
    task: str,
    job_id: str | int,
    source: str,
    destination: str,
    source_lfn: str,
    destination_lfn: str,
    size: int,
    adler32: str,
    file_type: str = "output",
    publish: bool = False,
    publish_info: Mapping[str, Any] | None = None,
    job_retry: int = 0,
    user_dn: str | None = None,
    group: str | None = None,
    role: str | None = None,
    priority: int | None = None,
    already_at_destination: bool = False,
    by: str | None = None,
    at: float | None = None,
) -> dict[str, Any]:
    """A new transfer request of these values, as it is (the schema judges it where it is
    recorded: aso/upload.py, then the store)."""
    stamp = now() if at is None else at
    state = "done" if already_at_destination else "new"
    doc: dict[str, Any] = {
        "_id": request_id(source_lfn),
        "type": REQUEST_TYPE,
        "schema": SCHEMA_VERSION,
        "user": user,
        "task": task,
        "job_id": str(job_id),
        "job_retry": job_retry,
        "file_type": file_type,
        "source": source,
        "destination": destination,
        "source_lfn": source_lfn,
        "destination_lfn": destination_lfn,
        "size": size,
        "checksum": {"adler32": adler32.lower().rjust(8, "0")},
        "publish": publish,
        STATE: state,
        CLEANUP: "not_needed" if already_at_destination else "pending",
        PUBLICATION: "pending" if publish and file_type == "output" else "not_required",
        "created": stamp,
        "last_update": stamp,
        "history": [{"axis": STATE, "from": None, "to": state, "at": stamp, "by": by or user}],
    }
    optional = {
        "user_dn": user_dn,
        "group": group,
        "role": role,
        "priority": priority,
        "publish_info": dict(publish_info) if publish_info else None,
    }
    doc.update({k: v for k, v in optional.items() if v is not None})
    return doc


# The history reason of a file its owner killed whose copy had finished before the kill took
# effect (kill_requested → done): the status row's `note`.
KILL_CAME_LATE = "the kill came too late: the copy had finished before it took effect"

# What an agent's deletion of a request revision that is no finished request says: the revision
# is one branch of a conflict between writers on a CouchDB cluster, withdrawn so that another
# stays the document (CLUSTER_ACCEPTED_IS_NOT_WON, CLUSTER_CONFLICTING_BRANCHES).
WITHDRAWN = "a conflicting branch"


def validation_model() -> dict[str, Any]:
    """The tables validate_doc_update reads, as JSON-ready data (the design doc's `lib/model`)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "request_type": REQUEST_TYPE,
        "schema": REQUEST_SCHEMA,
        "agent_schemas": {HEARTBEAT_TYPE: HEARTBEAT_SCHEMA},
        "agent_id_patterns": {HEARTBEAT_TYPE: HEARTBEAT_ID_PATTERN},
        "operator_schemas": {CONTROL_TYPE: CONTROL_SCHEMA},
        "operator_id_patterns": {CONTROL_TYPE: CONTROL_ID_PATTERN},
        "control_modes": CONTROL_MODES,
        "hold_type": HOLD_TYPE,
        "hold_schema": HOLD_SCHEMA,
        "hold_id_pattern": HOLD_ID_PATTERN,
        "hold_active": HOLD_ACTIVE,
        "hold_owner_states": list(HOLD_OWNER_STATES),
        "hold_kept_by_owner": list(HOLD_KEPT_BY_OWNER),
        "max_doc_chars": MAX_DOC_CHARS,
        "max_string": MAX_STRING,
        "max_safe_integer": MAX_SAFE_INTEGER,
        "store_members": list(STORE_MEMBERS),
        "doc_id_pattern": DOC_ID_PATTERN,
        "axes": list(AXES),
        "states": {axis: list(values) for axis, values in STATES.items()},
        "final": {axis: list(values) for axis, values in FINAL.items()},
        "axis_requires_state": AXIS_REQUIRES_STATE,
        "transitions": {
            axis: {f"{a}>{b}": sorted(roles) for (a, b), roles in table.items()}
            for axis, table in TRANSITIONS.items()
        },
        "creation": {
            state: {axis: list(values) for axis, values in axes.items()}
            for state, axes in CREATION.items()
        },
        "owner_mutable": list(OWNER_MUTABLE),
        "immutable": list(IMMUTABLE),
        "renewable": list(RENEWABLE),
        "renewal_moves": {axis: list(move) for axis, move in RENEWAL_MOVES.items()},
        "namespaced": list(NAMESPACED),
        "admin_roles": list(ADMIN_ROLES),
        "agent_role": AGENT_ROLE,
        "withdrawn": WITHDRAWN,
        "never_copied": list(NEVER_COPIED),
        "bookkeeping": BOOKKEEPING,
        "owner_max_priority": OWNER_MAX_PRIORITY,
        "clock_ahead": CLOCK_AHEAD,
        "clock_behind": CLOCK_BEHIND,
        "namespaces": {
            "temp_user_area": TEMP_USER_AREA,
            "user_area": USER_AREA,
            "group_area": GROUP_AREA,
            "group_role": GROUP_ROLE,
            "temp_hash_pattern": TEMP_HASH_PATTERN,
            "group_name_pattern": GROUP_NAME_PATTERN,
        },
    }
