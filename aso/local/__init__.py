"""What one host runs itself: the local document stores (`stores.py`: the embedded
pouchdb-server in `embedded.py`, a local CouchDB node or cluster in `couchdb.py`, the engine
`store.engine` names in `managed.py`), the embedded XRootD storage, a throw-away grid PKI and the
demo. Only the entry layer (the `aso` command, `aso run`'s supervisor) starts them; no library
module or agent imports them (tests/test_layout.py)."""
