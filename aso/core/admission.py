"""Admission that looks ahead: before the submitter sends a user's files to a destination, the
bytes they need are compared with the room the destination reports for that user's area
(cached per destination and user, refreshed every `holds.space_refresh` seconds), less what is
on its way there already; what cannot fit is not sent: it waits held (a `quota` hold with the
figures) until the hold checker finds the room. A destination that reports no free space
admits everything: its copies' own failures hold files then (aso/core/holds.py)."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Key = tuple[str, str]  # (destination, user)


def key_of(doc: Mapping[str, Any]) -> Key:
    return doc["destination"], doc["user"]


def size_of(doc: Mapping[str, Any]) -> int:
    return int(doc.get("size") or 0)


@dataclass
class Room:
    """What a destination reported free for a user's area, and the bytes sent there since
    (with those on their way when it was asked): room the report does not show yet."""

    free: int
    at: float
    committed: int = 0

    @property
    def left(self) -> int:
        return self.free - self.committed


@dataclass
class Rooms:
    """The room each destination reported for each user, as the submitter last asked."""

    refresh: float
    known: dict[Key, Room | None] = field(default_factory=dict)  # None: not reported
    asked: dict[Key, float] = field(default_factory=dict)  # when each was last asked

    def stale(self, keys: Iterable[Key], now: float) -> list[Key]:
        """The keys to ask again: never asked, or asked `refresh` seconds ago or more."""
        return sorted({k for k in keys if now - self.asked.get(k, -self.refresh) >= self.refresh})

    def learn(self, key: Key, free: int | None, on_its_way: int, now: float) -> None:
        """What the destination answered for `key` (None: it does not say), with the bytes on
        their way there at that moment."""
        self.asked[key] = now
        self.known[key] = None if free is None else Room(free, now, on_its_way)

    def forget(self, keys: Iterable[Key]) -> None:
        """Ask these again at the next look (what holds their files back rests on it)."""
        for key in keys:
            self.asked.pop(key, None)
            self.known.pop(key, None)

    def commit(self, docs: Iterable[Mapping[str, Any]]) -> None:
        """Files sent: their bytes count against their destination's room until it is asked
        again."""
        for doc in docs:
            room = self.known.get(key_of(doc))
            if room is not None:
                room.committed += size_of(doc)


def on_its_way(in_flight: Iterable[Mapping[str, Any]]) -> dict[Key, int]:
    """Bytes being copied to each destination for each user."""
    bytes_to: dict[Key, int] = {}
    for doc in in_flight:
        bytes_to[key_of(doc)] = bytes_to.get(key_of(doc), 0) + size_of(doc)
    return bytes_to


@dataclass(frozen=True)
class Refused:
    """A destination's files for one user that do not fit: the figures of their hold."""

    site: str
    user: str
    files: list[dict[str, Any]]
    free: int  # what the destination reported
    left: int  # of it, after what is on its way or was sent since

    @property
    def needs(self) -> int:
        """The room a look must find before the files go again: the largest of them."""
        return max(size_of(d) for d in self.files)

    @property
    def path(self) -> str:
        return posixpath.dirname(str(self.files[0]["destination_lfn"]))

    def reason(self) -> str:
        total = sum(size_of(d) for d in self.files)
        return (
            f"admission: {len(self.files)} files need {total} bytes, the largest {self.needs};"
            f" the destination reports {self.free} bytes free, {self.left} after the copies"
            " on their way"
        )


def admit(
    docs: list[dict[str, Any]], rooms: Mapping[Key, Room | None]
) -> tuple[list[dict[str, Any]], list[Refused]]:
    """The files that fit their destination's room, in the order given, and per destination
    and user those that do not: once one does not fit, none after it of that destination and
    user goes (its hold will hold them all). A destination not reported admits every file."""
    reported = {k: r for k, r in rooms.items() if r is not None}
    left = {k: r.left for k, r in reported.items()}
    fits: list[dict[str, Any]] = []
    refused: dict[Key, list[dict[str, Any]]] = {}
    for doc in docs:
        key = key_of(doc)
        if key not in left:
            fits.append(doc)
        elif key in refused or size_of(doc) > left[key]:
            refused.setdefault(key, []).append(doc)
        else:
            left[key] -= size_of(doc)
            fits.append(doc)
    return fits, [
        Refused(site, user, files, reported[site, user].free, left[site, user])
        for (site, user), files in refused.items()
    ]
