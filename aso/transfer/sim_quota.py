"""The simulator's destinations with a size limit (`aso sim --quota SITE:SIZE@START-END`).

A byte quota is an entry of `sim.outages` with `class` quota and `bytes`: from `start` to `end`
(seconds after the simulation's epoch) the site takes copies until the bytes that landed there
since `start` reach `bytes`; a copy that ends there past that fails with class `quota`, and the
site reports `bytes` less what landed as its free space. At `end` the limit is lifted (the
simulated user made room for good): copies land again and the site reports nothing.

Unlike the other faults, whether a copy lands is not a function of its job alone: it depends on
the copies that landed before it. Every process that asks (any monitor instance, on any host)
therefore decides through one ledger document per quota in the job table, `sim:quota:SITE@START`:
the copies that landed, by key, and their bytes. A copy is decided when a status first finds it
ended (those one status finds, in the order they ended), with the store's revision check (a
conflict: read again and decide again); one recorded there landed for good, one not recorded is
refused whenever its bytes do not fit, which stays so since the ledger only grows. A copy's
bytes count once it has landed, not while it is under way (the submitter's admission counts
those itself). Exact on one store node; on a cluster a write stored below its quorum is read
again like a conflict.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aso.store import Conflict, Database, StoreError
from aso.transfer.base import TransferError

log = logging.getLogger("aso.transfer.sim")

LEDGER_TYPE = "sim_quota"
ROUNDS = 20  # writes of one decision raced by others before the status is asked again later


@dataclass(frozen=True)
class Landing:
    """A copy that ended at a destination with a byte quota: `key` names it in the ledger."""

    key: str
    size: int
    end: float


def is_byte_quota(outage: Mapping[str, Any]) -> bool:
    return outage.get("bytes") is not None


def byte_quotas(outages: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [o for o in outages if is_byte_quota(o)]


def ledger_id(quota: Mapping[str, Any]) -> str:
    return f"sim:quota:{quota['site']}@{float(quota.get('start', 0)):g}"


def copy_key(job_id: str, file_id: str) -> str:
    return f"{job_id}/{file_id}"


def new_ledger(quota: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "_id": ledger_id(quota),
        "type": LEDGER_TYPE,
        "site": quota["site"],
        "limit": int(quota["bytes"]),
        "start": float(quota.get("start", 0)),
        "end": float(quota.get("end", 0)),
        "used": 0,
        "copies": {},  # key → bytes of each copy that landed
    }


def decide(
    ledger: Mapping[str, Any], landings: Iterable[Landing]
) -> tuple[dict[str, Any] | None, set[str]]:
    """The ledger once `landings` are decided, in the order they ended (a copy lands if its
    bytes fit what is left), and the keys refused; None when it has nothing new to record."""
    copies = dict(ledger.get("copies") or {})
    used, limit = int(ledger.get("used", 0)), int(ledger["limit"])
    refused: set[str] = set()
    for landing in sorted(landings, key=lambda c: (c.end, c.key)):
        if landing.key in copies:
            continue
        if used + landing.size <= limit:
            copies[landing.key] = landing.size
            used += landing.size
        else:
            refused.add(landing.key)
    if len(copies) == len(ledger.get("copies") or {}):
        return None, refused
    return {**ledger, "copies": copies, "used": used}, refused


class Ledgers:
    """The byte quotas' ledgers in the job table."""

    def __init__(self, db: Database):
        self.db = db

    def settle(self, quota: Mapping[str, Any], landings: list[Landing]) -> set[str]:
        """Decide `landings` at `quota`'s site: the keys refused for want of room.
        TransferError when the ledger cannot be read or written (the status is asked again)."""
        try:
            for _ in range(ROUNDS):
                current = self.db.get(ledger_id(quota)) or new_ledger(quota)
                updated, refused = decide(current, landings)
                if updated is None:
                    return refused
                try:
                    self.db.put(updated)
                except Conflict:
                    continue  # another process decided meanwhile: decide again on what it wrote
                return refused
        except StoreError as exc:
            raise TransferError(f"quota ledger {ledger_id(quota)} not read: {exc}") from exc
        raise TransferError(f"quota ledger {ledger_id(quota)} kept changing: asked again later")

    def used(self, quota: Mapping[str, Any]) -> int:
        """Bytes that landed at the quota's site since its start."""
        doc = self.db.get(ledger_id(quota))
        return 0 if doc is None else int(doc.get("used", 0))
