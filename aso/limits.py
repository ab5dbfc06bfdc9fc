"""Bounds of one request to the store, the same whoever sends it: the front end refuses more
(aso/routes.py), ASO's own clients send no more (aso/store.py cuts its batches to them), and
the embedded store's request guard holds its users to them (deploy/store/request-guard.js
MAX_BATCH)."""

MAX_KEYS = 1000  # keys of a view or `_all_docs`, doc_ids of `_changes`
MAX_DOCS = 1000  # documents of one `_bulk_docs`
# The longest a `_changes` long poll waits, in seconds: the front end ends one by then, on both
# stores (store.feed_timeout may not be longer).
MAX_FEED_TIMEOUT = 60.0
