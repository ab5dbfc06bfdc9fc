"""Every change an agent or the reconciler makes to a request, one named function each.

Each takes the document as read and returns the document to write (a copy: the change applied
with model.transition, its history entry appended, the fields that go with it set), or raises
model.TransitionError where the state machine forbids it. Nothing here reads or writes the store:
the caller writes the result back with the revision it read, and a conflict means someone else
acted first.

Two writers of the same change call the same function, so that they cannot drift apart: the
reconciler's own "cool-off over" once left `transfer` set where the retry manager's cleared it,
and the monitor reads `transfer` to pick its partition and to decide whether a kill
has a job to cancel.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from aso import model
from aso.model import ADMIN, AGENT, CLEANUP, PUBLICATION, STATE, Change
from aso.transfer import errors

Doc = dict[str, Any]
MAX_ATTEMPTS_KEPT = 200  # a request's `attempts`: the latest ones
MAX_REASON = 4096


def _transitioned(
    doc: Mapping[str, Any],
    axis: str,
    to: str,
    by: str,
    now: float,
    reason: str | None = None,
    role: str = AGENT,
    **fields: Any,
) -> Doc:
    return model.transition(doc, [Change(axis, to, by, reason)], role, at=now, **fields)


# --- the copy (`state`) -----------------------------------------------------------------------
def submitted(
    doc: Mapping[str, Any],
    job_id: str,
    service: str,
    by: str,
    now: float,
    lease: Mapping[str, Any],
) -> Doc:
    """The submitter's intent and the new attempt, in one write before the job goes to the
    service: the job's id (which the service derives from the job key) and a lease naming the
    owner, its end and the key. Until the lease ends the monitor waits for a job it does not
    find yet; then it releases the file (`released`)."""
    fields = job_fields(doc, job_id, service, now)
    fields["lease"] = dict(lease)
    # From `retry` too, once its cool-off is over (model.TO_SUBMIT): the cool-off's end stays
    # in the history entry that began it (retry_scheduled).
    return _transitioned(doc, STATE, "submitted", by, now, retry_after=None, **fields)


def lease_shortened(doc: Mapping[str, Any], until: float) -> Doc:
    """A lease taken by this submitter's dead predecessor (same instance name), made to end
    sooner: bookkeeping, no transition."""
    return {**doc, "lease": {**doc["lease"], "until": until}}


def job_fields(doc: Mapping[str, Any], job_id: str, service: str, now: float) -> dict[str, Any]:
    """What a document records of the job that carries its file: a new attempt."""
    attempt = {
        "job_id": job_id,
        "service": service,
        "submitted": now,
        "ended": None,
        "outcome": None,
        "reason": None,
        "error_class": None,
    }
    return {
        "lease": None,
        "transfer": {"job_id": job_id, "service": service, "file_id": doc["_id"]},
        "attempts": [*doc.get("attempts", []), attempt][-MAX_ATTEMPTS_KEPT:],
    }


def job_recorded(doc: Mapping[str, Any], job_id: str, service: str, now: float) -> Doc:
    """The job of a file killed before its submitter wrote `submitted`, found by its key: the
    job is recorded (no transition), so that the kill follows the path of every other one."""
    return {**doc, **job_fields(doc, job_id, service, now), "last_update": now}


def attempt_refused(
    doc: Mapping[str, Any], by: str, now: float, reason: str, error_class: str
) -> Doc:
    """A file whose job the service refused, or of which no job could be made:
    `failed_attempt` with the reason, for the retry manager (its attempt, if recorded, ends
    failed)."""
    if doc[STATE] == "submitted":  # its lease ends with the attempt
        return attempt_ended(
            doc, "failed_attempt", by, now, outcome="failed", reason=reason, error_class=error_class
        )
    return _transitioned(
        doc,
        STATE,
        "failed_attempt",
        by,
        now,
        reason,
        lease=None,
        retry_after=None,
        failure_reason=reason[:MAX_REASON],
        error_class=error_class,
    )


def attempt_ended(
    doc: Mapping[str, Any],
    state: str,
    by: str,
    now: float,
    *,
    outcome: str,
    reason: str | None = None,
    error_class: str | None = None,
    ended: float | None = None,
    fenced: str | None = None,
) -> Doc:
    """The file's transfer ended: `done`, `failed_attempt` or `killed`; its last attempt
    records the outcome, and a failure its reason and class (and `fenced`, the verdict of
    the fence of a job the service did not know: TransferService.fence)."""
    attempts = [dict(a) for a in doc.get("attempts", [])]
    if attempts:
        attempts[-1].update(
            ended=ended or now,
            outcome=outcome,
            reason=reason[:MAX_REASON] if reason else None,
            error_class=error_class,
        )
        if fenced is not None:
            attempts[-1]["fenced"] = fenced
    # The submitter's lease ends with the attempt (it only covered the job's creation).
    fields: dict[str, Any] = {"attempts": attempts, "lease": None}
    if state != "done":
        fields.update(failure_reason=(reason or "")[:MAX_REASON] or None, error_class=error_class)
    return _transitioned(doc, STATE, state, by, now, reason, **fields)


def job_lost(
    doc: Mapping[str, Any], by: str, now: float, reason: str, fenced: str | None = None
) -> Doc:
    """The transfer service does not know the file's job (or the job not the file): the
    attempt failed with class job_lost, or the file is killed if its owner asked for that.
    `fenced`: the verdict of the job's fence, which came first (TransferService.fence)."""
    return attempt_ended(
        doc,
        "killed" if doc[STATE] == "kill_requested" else "failed_attempt",
        by,
        now,
        reason=reason,
        error_class=errors.LOST,
        outcome="failed",
        fenced=fenced,
    )


# The reasons of attempts that ended because the service knew no job of them (with job_lost's
# class): the simulator's accounting checks that each was fenced first.
RELEASED = "lease expired, no job"
KILLED_BEFORE_ITS_JOB = "killed before its job"


def released(doc: Mapping[str, Any], by: str, now: float, fenced: str) -> Doc:
    """A file whose job never reached the service (its lease is over, the service knows no
    job of its key, and the job is fenced: `fenced`, the fence's verdict): back to the
    queue, its attempt ended as never begun."""
    reason = RELEASED
    attempts = [dict(a) for a in doc.get("attempts", [])]
    if doc[STATE] == "submitted" and attempts:
        attempts[-1].update(ended=now, outcome="canceled", reason=reason, fenced=fenced)
    return _transitioned(
        doc, STATE, "new", by, now, reason, lease=None, transfer=None, attempts=attempts
    )


def retry_scheduled(doc: Mapping[str, Any], by: str, now: float, delay: float, reason: str) -> Doc:
    """A failed attempt to be tried again after a cool-off of `delay` seconds: the submitter
    takes it from `retry` once `retry_after` has passed. The history entry keeps the cool-off's
    end (`until`) for the file's story, since `retry_after` goes with the next attempt."""
    until = round(now + delay, 3)
    moved = _transitioned(doc, STATE, "retry", by, now, reason, retry_after=until)
    moved["history"][-1]["until"] = until
    return moved


def held(doc: Mapping[str, Any], by: str, now: float, delay: float, reason: str, hold: str) -> Doc:
    """A failed attempt a hold holds (aso/core/holds.py; `hold` its id): in `retry` as after
    any failure, the attempt marked `held` with it so that it spends nothing of the file's
    budget, and its status row names the hold."""
    moved = retry_scheduled(doc, by, now, delay, reason)
    attempts = list(moved.get("attempts") or [])
    if attempts:
        attempts[-1] = {**attempts[-1], "held": hold}
    moved["attempts"] = attempts
    return moved


def given_up(doc: Mapping[str, Any], by: str, now: float, reason: str, **class_: Any) -> Doc:
    """A failed attempt that ends the request: `failed` for good, with the reason (and
    `error_class=` where it is not its last attempt's)."""
    return _transitioned(
        doc,
        STATE,
        "failed",
        by,
        now,
        reason,
        retry_after=None,
        failure_reason=reason[:MAX_REASON],
        **class_,
    )


def stopped_waiting(
    doc: Mapping[str, Any], by: str, now: float, reason: str, error_class: str
) -> Doc:
    """A file given up while it waited (`new`, `retry`, or a failed attempt): its hold was
    cancelled or passed its deadline, or its own deadline passed (errors.EXPIRED): `failed`,
    with the class and reason (its owner may resubmit it)."""
    return given_up(doc, by, now, reason, error_class=error_class)


def set_aside(doc: Mapping[str, Any], by: str, now: float, reason: str) -> Doc:
    """A file an agent could not act on (aso.runtime.set_aside_reason): its attempt ends with
    class unprocessable, which the retry manager takes as permanent; a file already waiting for
    that decision is given up at once; a kill still ends `killed`."""
    state = doc[STATE]
    if state in model.BEFORE_A_JOB:
        return attempt_refused(doc, by, now, reason, errors.UNPROCESSABLE)
    if state in model.AT_THE_SERVICE:
        return attempt_ended(
            doc,
            "killed" if state == "kill_requested" else "failed_attempt",
            by,
            now,
            reason=reason,
            error_class=errors.UNPROCESSABLE,
            outcome="failed",
        )
    if state == "failed_attempt":
        return given_up(doc, by, now, reason)
    raise model.TransitionError(f"a request in state {state} is not set aside by an agent")


def recopy(doc: Mapping[str, Any], by: str, now: float, reason: str) -> Doc:
    """A done file whose destination copy is missing or damaged while its temporary copy is
    whole: copied again (an operator's repair; only an admin may move a copy back from done)."""
    changes = [Change(STATE, "new", by, reason)]
    fields: dict[str, Any] = {
        "lease": None,
        "retry_after": None,
        "failure_reason": None,
        "error_class": None,
    }
    if doc.get(CLEANUP) != "pending":
        changes.append(Change(CLEANUP, "pending", by, reason))
        fields.update(cleanup_error=None, cleanup_retry_after=None, cleanup_attempts=0)
    return model.transition(doc, changes, ADMIN, at=now, **fields)


# --- the temporary copy (`cleanup`) -----------------------------------------------------------
def discarding(doc: Mapping[str, Any], now: float) -> Doc:
    """A failed or killed file whose temporary copy the cleaner is about to delete: no
    resubmission or renewal until the outcome is recorded (validate_doc_update)."""
    return model.transition(doc, [], AGENT, at=now, discarding=now)


def _discard_over(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {"discarding": None} if doc.get("discarding") is not None else {}


def cleaned(doc: Mapping[str, Any], by: str, now: float, reason: str) -> Doc:
    return _transitioned(
        doc, CLEANUP, "cleaned", by, now, reason, cleanup_error=None, cleanup_retry_after=None,
        **_discard_over(doc),
    )  # fmt: skip


def cleanup_failed(
    doc: Mapping[str, Any], by: str, now: float, reason: str, base_delay: float, max_delay: float
) -> Doc:
    """A deletion that failed: `cleanup_error` (recorded once), tried again after a backoff
    that doubles with each attempt."""
    attempts = doc.get("cleanup_attempts", 0) + 1
    delay = min(max_delay, base_delay * 2 ** (attempts - 1))
    first = doc[CLEANUP] != "cleanup_error"
    changes = [Change(CLEANUP, "cleanup_error", by, reason)] if first else []
    return model.transition(
        doc,
        changes,
        AGENT,
        at=now,
        cleanup_attempts=attempts,
        cleanup_error=reason[:MAX_REASON],
        cleanup_retry_after=round(now + delay, 3),
        **_discard_over(doc),
    )


# --- publication ------------------------------------------------------------------------------
def publication_retried(doc: Mapping[str, Any], by: str, now: float) -> Doc:
    """A failed publication whose backoff is over: waiting for a block again."""
    return _transitioned(doc, PUBLICATION, "pending", by, now, publication_retry_after=None)


def published(doc: Mapping[str, Any], by: str, now: float, block: str, reason: str) -> Doc:
    """The catalog holds the file in `block`."""
    return _transitioned(
        doc,
        PUBLICATION,
        "published",
        by,
        now,
        reason,
        publication_block=block,
        publication_error=None,
        publication_retry_after=None,
    )


def publication_failed_attempt(
    doc: Mapping[str, Any],
    by: str,
    now: float,
    reason: str,
    attempts: int,
    retry_after: float,
    block: str | None,
) -> Doc:
    """A publication of `block` the catalog refused or failed, or of a file not confirmed at
    its destination (no block): `publication_error`, tried again after `retry_after`."""
    return _publication_ended(
        doc, "publication_error", by, now, reason, attempts, block, retry_after
    )


def publication_refused(
    doc: Mapping[str, Any], by: str, now: float, reason: str, attempts: int, block: str | None
) -> Doc:
    """A publication that trying again cannot heal (the destination disproves the file, the
    catalog refuses it for good): `publication_failed` at once, with the reason."""
    return _publication_ended(doc, "publication_failed", by, now, reason, attempts, block, None)


def _publication_ended(
    doc: Mapping[str, Any],
    to: str,
    by: str,
    now: float,
    reason: str,
    attempts: int,
    block: str | None,
    retry_after: float | None,
) -> Doc:
    return _transitioned(
        doc,
        PUBLICATION,
        to,
        by,
        now,
        reason,
        publication_attempts=attempts,
        publication_block=block,
        publication_error=reason[:MAX_REASON],
        publication_retry_after=retry_after,
    )


def block_corrected(doc: Mapping[str, Any], by: str, now: float, block: str) -> Doc:
    """A published file the catalog holds in another block than the one recorded: the block
    the catalog says (no transition)."""
    return model.transition(doc, [], AGENT, at=now, publication_block=block)


def republished(doc: Mapping[str, Any], by: str, now: float, reason: str) -> Doc:
    """A published file the catalog does not hold: published again (an operator's repair;
    only an admin may move a publication back from published)."""
    return _transitioned(
        doc,
        PUBLICATION,
        "pending",
        by,
        now,
        reason,
        ADMIN,
        publication_block=None,
        publication_error=None,
        publication_retry_after=None,
        publication_attempts=0,
    )


# The changes the reconciler's repairs name (aso/reconcile.py Repair.operation), each called as
# OPERATION(doc, by, now, reason, **args).
REPAIRS: dict[str, Callable[..., Doc]] = {
    "job_lost": job_lost,
    "block_corrected": lambda doc, by, now, reason, block: block_corrected(doc, by, now, block),
    "republished": republished,
    "recopy": recopy,
}


def renewable(doc: Mapping[str, Any], retry: Mapping[str, Any]) -> str | None:
    """Why `retry` (a new request under `doc`'s id, with another file) cannot renew `doc`, in
    the uploader's terms; None: it can (docs/status-api.md, "Job retries")."""
    lfn, state = doc.get("source_lfn"), doc.get(STATE)
    recorded = f"a different file for {lfn} is recorded (job retry {doc.get('job_retry', 0)}"
    if state not in model.NEVER_COPIED:
        return (
            f"{recorded}, {state}): a job retry may replace a request that failed or was "
            "killed, not one on its way or copied"
        )
    if not retry.get("job_retry", 0) > doc.get("job_retry", 0):
        return f"{recorded}, {state}): a new file needs a higher job_retry"
    return None


def renewed(doc: Mapping[str, Any], retry: Mapping[str, Any], by: str, now: float) -> Doc:
    """A request that was never copied, renewed by its owner with a job retry's new file under
    the same LFN (`retry`, the new request): queued again like a resubmission, with the retry's
    job_retry, size, checksum and publication details."""
    fields = {k: retry[k] for k in model.RENEWABLE if k in retry}
    reason = f"job retry {retry['job_retry']}: a new file under the same LFN"
    changes = [Change(STATE, "new", by, reason)]
    if doc.get(CLEANUP) == "cleaned":  # the failed file's copy was discarded; this one is new
        changes.append(Change(CLEANUP, "pending", by, reason))
    return model.transition(doc, changes, model.OWNER, at=now, renewal=True, **fields)
