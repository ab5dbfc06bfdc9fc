"""What one machine runs for development, tests and the demo, and production does not need: the
embedded document store (pouchdb-server), the embedded XRootD storage, a throw-away grid PKI
and the demo. Only the entry layer (the `aso` command, `aso run`'s supervisor, the choice of a
store engine) starts them; no library module or agent imports them (tests/test_layout.py)."""
