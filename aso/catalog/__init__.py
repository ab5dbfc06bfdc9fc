"""Catalogs that finished files are published to, behind one small interface
(aso.catalog.base): `embedded` (a catalog database in the document store, the default) and
`dbs` (DBS3 through its official client, production). `open_catalog(config)` picks one."""

from __future__ import annotations

from aso.catalog.base import Catalog
from aso.config import Config
from aso.store import Server


def open_catalog(config: Config, server: Server | None = None) -> Catalog:
    """The catalog of `publisher.catalog`, as the publisher uses it."""
    if config.publisher.catalog == "dbs":
        from aso.catalog.dbs import DbsCatalog

        return DbsCatalog.from_config(config)
    from aso.catalog.embedded import EmbeddedCatalog

    server = server or Server.from_config(config, account="agent")
    return EmbeddedCatalog(server.db(config.store.catalog_db))
