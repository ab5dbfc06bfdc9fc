"""The store a host manages (`aso store start`, `aso run`): the engine `store.engine` names.

Apart from aso/local/stores.py, which holds what every engine shares (the base classes the
engines import), so that the choice of an engine imports the engines and nothing imports back.
"""

from __future__ import annotations

from aso.config import Config
from aso.local.couchdb import local_couchdb
from aso.local.embedded import EmbeddedStore
from aso.local.stores import LocalCluster, LocalStore, LocalStoreError


def local_store(config: Config, *, nodes: int | None = None) -> LocalStore | LocalCluster:
    """The store `aso store start` and `aso run` manage for this config (store.engine):
    pouchdb-server, one CouchDB node, or a CouchDB cluster of `nodes` (couchdb.nodes) nodes."""
    engine = config.store.engine
    if engine == "pouchdb":
        if nodes not in (None, 1):
            raise LocalStoreError("--nodes needs store.engine = couchdb (pouchdb-server is one)")
        return EmbeddedStore(config)
    return local_couchdb(config, nodes)
