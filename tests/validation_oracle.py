"""The store's validation in Python: a line-by-line twin of
couchapp/asyncstageout/validate_doc_update.js, kept as a test oracle (issue 19: the rules live
once, in aso/model.py's tables and the JavaScript; this copy only lets the tests know the
store's verdict without asking it, and the hostile suite compares the two on every generated
write)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from aso import jsvalues as js
from aso.model import (
    ADMIN,
    ADMIN_ROLES,
    AGENT_ROLE,
    AXES,
    AXIS_REQUIRES_STATE,
    CREATION,
    GROUP_AREA,
    GROUP_ROLE,
    HEARTBEAT_ID_PATTERN,
    HEARTBEAT_SCHEMA,
    HEARTBEAT_TYPE,
    IMMUTABLE,
    NAMESPACED,
    NEVER_COPIED,
    ONE_CHANGE_STAMP,
    ONE_CREATION_STAMP,
    OWNER,
    OWNER_ENTRY_RULE,
    OWNER_MAX_PRIORITY,
    OWNER_MUTABLE,
    PRIORITY_RULE,
    PUBLICATION,
    RENEWABLE,
    STATE,
    TEMP_USER_AREA,
    TRANSITIONS,
    USER_AREA,
    WITHDRAWN,
    Refusal,
    _check_object,
    bookkeeping_refusal,
    check_schema,
    granted_groups,
    in_temp_area,
    is_final,
    publication_refusal,
    role_of,
    stamp_refusal,
    task_refusal,
)


def dataset_owner(dataset: str) -> str | None:
    """Who a dataset belongs to: the part of its processed name before the first "-"."""
    parts = dataset.split("/")
    processed = parts[2] if len(parts) > 2 else ""
    cut = processed.find("-")
    return processed[:cut] if cut > 0 else None


def namespace_refusal(doc: Mapping[str, Any], name: str, roles: Any) -> str | None:
    """Why a request of user `name` (with `roles`) reaches outside the user's namespace, or
    None. validate_doc_update.js follows it line by line (`namespaceRefusal`)."""
    if not in_temp_area(name, doc["source_lfn"]):
        return (
            f"source_lfn must be in {TEMP_USER_AREA}{name}/ or {TEMP_USER_AREA}{name}.<hash>/ "
            "(the user's own temporary area"
            + (
                ")"
                if "." not in name
                else '; a temporary area belongs to the part of its name before the first ".", '
                'so a user whose name holds a "." owns none)'
            )
        )
    groups = granted_groups(roles)
    destination = doc["destination_lfn"]
    if not destination.startswith(USER_AREA + name + "/") and not any(
        destination.startswith(GROUP_AREA + g + "/") for g in groups
    ):
        granted = (
            f"or {GROUP_AREA}<group>/ of {', '.join(groups)}"
            if groups
            else (f"(a group area {GROUP_AREA}<group>/ needs the role {GROUP_ROLE}<group>)")
        )
        return f"destination_lfn must be in {USER_AREA}{name}/ {granted}"
    info = doc.get("publish_info")
    dataset = info.get("dataset") if isinstance(info, dict) else None
    if isinstance(dataset, str):
        owner = dataset_owner(dataset)
        if owner is None or (owner != name and owner not in groups):
            return (
                f"publish_info.dataset must be /<primary>/{name}-<processed>/USER (the user's "
                "own datasets"
                + (
                    ")"
                    if "-" not in name
                    else "; a dataset belongs to the part of its processed name before the "
                    'first "-", so a user whose name holds a "-" owns none)'
                )
            )
    return None


def check_namespaces(
    new: Mapping[str, Any], old: Mapping[str, Any] | None, role: str, user_ctx: Mapping[str, Any]
) -> None:
    """Where a request's files and dataset lie, judged on every write that sets them (a
    creation, the owner's renewal) by the owner's namespace (`checkNamespaces`)."""
    changed = old is None or any(
        not js.same(new.get(f, js.UNDEFINED), old.get(f, js.UNDEFINED)) for f in NAMESPACED
    )
    if not changed:
        return
    if role != OWNER:
        raise Refusal("immutable", f"{', '.join(NAMESPACED)} are set by the owner only")
    outside = namespace_refusal(new, user_ctx["name"], user_ctx.get("roles"))
    if outside:
        raise Refusal("namespace", outside)


def check_current(new: Mapping[str, Any], parent: Mapping[str, Any] | None) -> None:
    """A write is based on the current revision `parent` (a creation: on none, or on the
    deleted document's); any other is a conflict, which the embedded store would otherwise
    store unjudged (`checkCurrent`; EMBEDDED_VALIDATES_BEFORE_CONFLICT)."""
    rev = new.get("_rev", js.UNDEFINED)
    live = parent is not None and parent.get("_deleted") is not True
    if parent is None:
        based = rev is js.UNDEFINED
    else:  # JavaScript's === on the store's string
        based = (isinstance(rev, str) and rev == parent.get("_rev")) or (
            not live and rev is js.UNDEFINED
        )
    if based:
        return
    if not live:
        raise Refusal(
            "conflict",
            f"the write is based on revision {js.stringify(rev)} of a document that does not "
            "exist: a creation has no _rev",
        )
    current = parent["_rev"] if parent is not None else None
    if rev is js.UNDEFINED:
        raise Refusal(
            "conflict",
            f"a document with this id exists (revision {current}): read it, not create it again",
        )
    raise Refusal(
        "conflict",
        f"the write is based on revision {js.stringify(rev)}, not on the current {current}: "
        "read the document again",
    )


def validate_doc_update(
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    user_ctx: Mapping[str, Any],
    sites: Sequence[str] | None = None,
    now: float | None = None,
) -> None:
    """What validate_doc_update.js decides for writing `new` over `old` (None: a creation) as
    `user_ctx`: returns when the store lets the write through, raises Refusal with the store's
    reason otherwise. A line-by-line twin of the JavaScript, so that every writer (and the
    hostile-input tests) can know the store's verdict without asking it. `sites`: the design
    document's `lib/sites` (None: the twin leaves sites unjudged); `now`: the store's clock
    (None: this host's, which is the test stores' clock)."""
    clock = time.time() if now is None else now
    roles = user_ctx.get("roles") or []
    is_admin = any(r in roles for r in ADMIN_ROLES)
    is_agent = AGENT_ROLE in roles
    if not is_admin:
        check_current(new, old)
    if old is not None and old.get("_deleted") is True:
        old = None  # a deleted request may be created again
    doc_id = new.get("_id")
    if doc_id is not None and not isinstance(doc_id, str):
        raise Refusal("schema", "doc._id must be a string")
    if isinstance(doc_id, str) and doc_id.startswith("_design/"):
        if not is_admin:
            raise Refusal("design", "only admins may change design documents")
        return
    if new.get("_deleted") is True:
        _check_deletion(new, old, is_admin, is_agent)
        return
    kind = new.get("type")
    if isinstance(kind, str) and kind == HEARTBEAT_TYPE:
        _check_agent_doc(new, is_admin, is_agent)
        return
    check_schema(new, creation=old is None)
    name = user_ctx.get("name")
    role = role_of(user_ctx, new)
    if role is None:
        raise Refusal(
            "owner",
            f"user {js.stringify(name)} may not write requests of user {js.stringify(new['user'])}",
        )
    if role == ADMIN:
        return
    if old is not None and role == OWNER and old.get("user") != name:
        raise Refusal(
            "owner",
            f"user {js.stringify(name)} may not take over a request of user "
            f"{js.stringify(old.get('user', js.UNDEFINED))}",
        )
    if old is None:
        # role_of makes only a user_ctx with a name an owner; _check_creation refuses other roles.
        _check_creation(new, role, user_ctx, sites, clock)
    else:
        _check_update(new, old, role, user_ctx, clock)


def _check_deletion(
    new: Mapping[str, Any], old: Mapping[str, Any] | None, is_admin: bool, is_agent: bool
) -> None:
    if is_admin:
        return
    if is_agent and old is not None and (old.get("type") == HEARTBEAT_TYPE or is_final(old)):
        return
    if is_agent and js.same(new.get("withdrawn", js.UNDEFINED), WITHDRAWN):
        return  # a branch of a cluster's conflict, withdrawn (aso/store/)
    if is_agent:
        raise Refusal("delete", "agents may only delete finished requests")
    raise Refusal("delete", "only agents (finished requests) and admins may delete documents")


def _check_agent_doc(new: Mapping[str, Any], is_admin: bool, is_agent: bool) -> None:
    if not is_agent and not is_admin:
        raise Refusal("agent-doc", f"only agents write {HEARTBEAT_TYPE} documents")
    _check_object("doc", new, HEARTBEAT_SCHEMA)
    if not js.test(HEARTBEAT_ID_PATTERN, str(new.get("_id", ""))):
        raise Refusal("schema", f"doc._id does not name a {HEARTBEAT_TYPE}")


def site_refusal(doc: Mapping[str, Any], sites: Sequence[str] | None) -> str | None:
    """Why a request names a site this ASO does not know (None: it does not). An unknown site
    once crash-looped the submitter (issue 18); the store now refuses it at upload."""
    if sites is None:
        return None
    for end in ("source", "destination"):
        if doc[end] not in sites:
            known = ", ".join(sites) or "none"
            return f"{end} {js.stringify(doc[end])} is not a site of this ASO (its sites: {known})"
    return None


def _check_creation(
    new: Mapping[str, Any],
    role: str,
    user_ctx: Mapping[str, Any],
    sites: Sequence[str] | None,
    now: float,
) -> None:
    if role != OWNER:
        raise Refusal("create", "only the owner (or an admin) may create a request")
    if new[STATE] not in CREATION:
        raise Refusal(
            "create",
            f"a request is created with {STATE} {' or '.join(sorted(CREATION))}, not {new[STATE]}",
        )
    for axis, allowed in CREATION[new[STATE]].items():
        if new[axis] not in allowed:
            raise Refusal(
                "create",
                f"a request created {new[STATE]} has {axis} {' or '.join(allowed)}, "
                f"not {new[axis]}",
            )
    unknown = site_refusal(new, sites)
    if unknown:
        raise Refusal("site", unknown)
    check_namespaces(new, None, role, user_ctx)
    name = user_ctx["name"]  # an owner has a name (role_of)
    task = task_refusal(new["task"], name)
    if task:
        raise Refusal("task", task)
    if len(new["history"]) != 1:
        raise Refusal("history", "a new request has exactly one history entry")
    entry = new["history"][0]
    if entry["axis"] != STATE or entry["from"] is not None or entry["to"] != new[STATE]:
        raise Refusal("history", "the first history entry must record the creation state")
    if entry["by"] != name:
        raise Refusal("history", f"history entries of an owner must be by {name}")
    check_owner_entry(entry)
    check_owner_creation(new, entry, now)


def check_owner_entry(entry: Mapping[str, Any]) -> None:
    """An owner's history entry carries no cool-off of the retry manager (`checkOwnerEntry`)."""
    if "until" in entry:
        raise Refusal("history", OWNER_ENTRY_RULE)


def check_owner_creation(new: Mapping[str, Any], entry: Mapping[str, Any], now: float) -> None:
    """What a job knows, and nothing an agent acts on (`checkOwnerCreation`)."""
    publication = publication_refusal(new)
    if publication:
        raise Refusal("create", publication)
    bookkeeping = bookkeeping_refusal(new)
    if bookkeeping:
        raise Refusal("create", bookkeeping)
    if "priority" in new and new["priority"] > OWNER_MAX_PRIORITY:
        raise Refusal("create", PRIORITY_RULE)
    if new["last_update"] != new["created"] or entry["at"] != new["created"]:
        raise Refusal("time", ONE_CREATION_STAMP)
    late = stamp_refusal("created", new["created"], now)
    if late:
        raise Refusal("time", late)


def check_owner_stamps(new: Mapping[str, Any], appended: Sequence[Any], now: float) -> None:
    """An owner's change is stamped once, with the store's time (`checkOwnerStamps`)."""
    for entry in appended:
        check_owner_entry(entry)
        if entry["at"] != new["last_update"]:
            raise Refusal("time", ONE_CHANGE_STAMP)
    late = stamp_refusal("last_update", new["last_update"], now)
    if late:
        raise Refusal("time", late)


def renewal(new: Mapping[str, Any], old: Mapping[str, Any], role: str) -> bool:
    """A job retry's new file under the same LFN: the owner renews a request never copied."""
    new_retry, old_retry = new.get("job_retry"), old.get("job_retry")
    return (
        role == OWNER
        and old.get(STATE) in NEVER_COPIED
        and new.get(STATE) == "new"
        and js.is_number(new_retry)
        and js.is_number(old_retry)
        and new_retry > old_retry
    )


def _check_update(
    new: Mapping[str, Any],
    old: Mapping[str, Any],
    role: str,
    user_ctx: Mapping[str, Any],
    now: float,
) -> None:
    name = user_ctx.get("name")
    renewing = renewal(new, old, role)
    for field_name in IMMUTABLE:
        if renewing and field_name in RENEWABLE:
            continue
        if not js.same(new.get(field_name, js.UNDEFINED), old.get(field_name, js.UNDEFINED)):
            raise Refusal("immutable", f"{field_name} cannot change after creation")
    check_namespaces(new, old, role, user_ctx)
    if role == OWNER:
        _check_owner_fields(new, old, renewing)
    old_history = old.get("history") or []
    history = new["history"]
    if len(history) < len(old_history):
        raise Refusal("history", "history entries cannot be removed")
    if not all(js.same(a, b) for a, b in zip(history, old_history, strict=False)):
        raise Refusal("history", "history entries cannot be changed")
    appended = history[len(old_history) :]
    changed = sum(_check_axis(axis, new, old, appended, role, name) for axis in AXES)
    if len(appended) != changed:
        raise Refusal(
            "history",
            "history gets exactly one entry per state change "
            f"({changed} changes, {len(appended)} entries)",
        )
    if role == OWNER and changed == 0:
        raise Refusal("owner", "owners may only request a kill or a resubmission")
    if role == OWNER:
        # A publication reset asks for a publication, which only an output to publish has.
        moved = not js.same(new.get(PUBLICATION, js.UNDEFINED), old.get(PUBLICATION, js.UNDEFINED))
        publication = publication_refusal(new) if moved else None
        if publication:
            raise Refusal("transition", publication)
        check_owner_stamps(new, appended, now)


def _check_owner_fields(new: Mapping[str, Any], old: Mapping[str, Any], renewing: bool) -> None:
    for key in js.keys(new):
        if key.startswith("_") or key in OWNER_MUTABLE or (renewing and key in RENEWABLE):
            continue
        if not js.same(new[key], old.get(key, js.UNDEFINED)):
            raise Refusal(
                "owner", f"owners may only request a kill or a resubmission; {key} cannot change"
            )
    for key in js.keys(old):
        if not key.startswith("_") and key not in new and key not in OWNER_MUTABLE:
            raise Refusal(
                "owner",
                f"owners may only request a kill or a resubmission; {key} cannot be removed",
            )


def _check_axis(
    axis: str,
    new: Mapping[str, Any],
    old: Mapping[str, Any],
    appended: Sequence[Mapping[str, Any]],
    role: str,
    name: str | None,
) -> int:
    """1 if `axis` changed legally (with its history entry), 0 if it did not change."""
    # The documents' values as written (any JSON value, or None when missing).
    was: Any = old.get(axis)
    now_: Any = new.get(axis)
    if was == now_:
        return 0
    allowed = TRANSITIONS[axis].get((was, now_))
    if not allowed:
        raise Refusal("transition", f"{axis} cannot go from {was} to {now_}")
    if role not in allowed:
        raise Refusal(
            "transition",
            f"only {' or '.join(sorted(allowed))} may move {axis} "
            f"from {was} to {now_}, not the {role}",
        )
    needs = AXIS_REQUIRES_STATE[axis]
    if needs and new[STATE] != needs:
        raise Refusal("transition", f"{axis} may only change while state is {needs}")
    entries = [e for e in appended if (e["axis"], e["from"], e["to"]) == (axis, was, now_)]
    if not entries:
        raise Refusal(
            "history", f"the change of {axis} from {was} to {now_} needs its history entry"
        )
    if role == OWNER and entries[-1]["by"] != name:
        raise Refusal("history", f"history entries of an owner must be by {name}")
    return 1
