"""Operators' controls, as plain functions over documents: a site banned or draining (as source,
destination or both) and a user banned, each one `control` document (aso/model.py), and what
they mean for a file waiting to be submitted (`held_back`: nothing new starts on a banned or
draining site, nor for a banned user; the files wait, with the reason, until `allow`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aso import model
from aso.model import ALLOW, AS_DESTINATION, AS_SOURCE, BOTH, SITE, USER


@dataclass(frozen=True)
class Setting:
    """A site's or user's control in force: its mode, direction and who set it when and why."""

    kind: str
    name: str
    mode: str
    direction: str
    reason: str
    by: str
    at: float

    def covers(self, role: str) -> bool:
        """Whether it holds for the site as `role` (source or destination)."""
        return self.direction in (BOTH, role)

    def says(self) -> str:
        where = "" if self.direction == BOTH else f" as {self.direction}"
        return f"{self.kind} {self.name} {self.mode}{where} by {self.by}: {self.reason}"


@dataclass(frozen=True)
class Controls:
    """The settings in force (`allow` is none), by site and by user."""

    sites: dict[str, Setting] = field(default_factory=dict)
    users: dict[str, Setting] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.sites or self.users)

    def all(self) -> list[Setting]:
        return [*self.sites.values(), *self.users.values()]


def setting_of(doc: Mapping[str, Any]) -> Setting:
    return Setting(
        doc["kind"], doc["name"], doc["mode"], doc["direction"], doc["reason"], doc["by"], doc["at"]
    )


def controls_of(docs: Iterable[Mapping[str, Any]]) -> Controls:
    """The controls in force among `docs` (other documents are ignored)."""
    sites: dict[str, Setting] = {}
    users: dict[str, Setting] = {}
    for doc in docs:
        if doc.get("type") != model.CONTROL_TYPE or doc.get("mode") == ALLOW:
            continue
        setting = setting_of(doc)
        (sites if setting.kind == SITE else users)[setting.name] = setting
    return Controls(sites, users)


def holding(user: str, source: str, destination: str, controls: Controls) -> Setting | None:
    """The control that keeps a file of `user` from `source` to `destination` from starting
    now, if any: its user banned, its source or destination banned or draining in that
    direction."""
    if not controls:
        return None
    banned = controls.users.get(user)
    if banned is not None:
        return banned
    for site, role in ((source, AS_SOURCE), (destination, AS_DESTINATION)):
        setting = controls.sites.get(site)
        if setting is not None and setting.covers(role):
            return setting
    return None


def held_back(doc: Mapping[str, Any], controls: Controls) -> Setting | None:
    """`holding` for a request document."""
    return holding(doc["user"], doc["source"], doc["destination"], controls)


def changed(
    current: Mapping[str, Any] | None,
    kind: str,
    name: str,
    mode: str,
    reason: str,
    by: str,
    at: float,
    direction: str = BOTH,
) -> dict[str, Any]:
    """The control document of `kind` `name` set to `mode` (the current one, if any, given):
    the new setting, with every earlier one kept in its history."""
    if mode not in model.CONTROL_MODES[kind]:
        raise ValueError(f"a {kind} may be set to {' or '.join(model.CONTROL_MODES[kind])}")
    if kind == USER and direction != BOTH:
        raise ValueError("a user's control has no direction")
    setting = {"mode": mode, "direction": direction, "reason": reason, "by": by, "at": at}
    doc: dict[str, Any] = {
        "_id": model.control_id(kind, name),
        "type": model.CONTROL_TYPE,
        "kind": kind,
        "name": name,
        **setting,
        "history": [*((current or {}).get("history") or []), setting],
    }
    if current is not None:
        doc["_rev"] = current["_rev"]
    return doc
