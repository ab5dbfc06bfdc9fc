"""The store's own JavaScript in QuickJS for the tests (aso/provision/storejs.py runs it): the
store's verdict on a write, or a view's rows for a document, without a store and from the one
source of the rules (couchapp/), not from a copy of them. The fast tier judges writes with it,
and the suites on the real stores check that the stores and it agree.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from aso.config import Config, SiteConfig
from aso.provision import storejs
from aso.provision.storejs import FILES_DDOC, DesignDocument, request_refusal

__all__ = ["FILES_DDOC", "DesignDocument", "check_schema", "files_design", "validate_doc_update"]


@functools.cache
def files_design(sites: tuple[str, ...] | None = None) -> DesignDocument:
    """The files database's design document as `aso db init` pushes it for a catalogue of
    `sites` (None: the default configuration's)."""
    config = Config()
    if sites is not None:
        config.sites = {name: SiteConfig(protocol="sim") for name in sites}
    return storejs.files_design(config)


def validate_doc_update(
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    user_ctx: Mapping[str, Any],
    sites: Sequence[str] | None = None,
    now: float | None = None,
) -> None:
    """What the files database's validate_doc_update decides for writing `new` over `old` (None:
    a creation) as `user_ctx`, for a catalogue of `sites` (None: the default configuration's),
    at the store's clock `now` (None: this host's, the test stores' clock)."""
    design = files_design(None if sites is None else tuple(sorted(sites)))
    design.validate(new, old, user_ctx, None, now)


def check_schema(doc: Any, *, creation: bool = True) -> None:
    """Raise the store's refusal (lib/schema.js) when `doc` is no request of the schema."""
    refused = request_refusal(doc, creation=creation)
    if refused is not None:
        raise refused
