"""Bounds of one request to the store, the same whoever sends it: the front end refuses more
(aso/frontend/routes.py), ASO's own clients send no more (aso/store/ cuts its batches to them), and
the embedded store's request guard holds its users to them (deploy/store/request-guard.js
MAX_BATCH)."""

MAX_KEYS = 1000  # keys of a view or `_all_docs`, doc_ids of `_changes`
MAX_DOCS = 1000  # documents of one `_bulk_docs`
# Lookups of one of a user's reads that stay a light read at the front end (more: a heavy one,
# paced): keys of a read by keys, changes of a `_changes` batch (each a document the embedded
# store reads). Four reads of 1,000 keys at once had kept the embedded store 80 % busy.
LIGHT_LOOKUPS = 100
# A user's write counts at frontend.user_docs_per_second as one document per PACED_DOC_BYTES of
# its body, at least one a document: 3,000 requests of 69 KB at the document pace had grown the
# store by 153 MB in 38 s and slowed bob's reads six times (a request is ~1 KB).
PACED_DOC_BYTES = 4096
# The longest a `_changes` long poll waits, in seconds: the front end ends one by then, on both
# stores (store.feed_timeout may not be longer).
MAX_FEED_TIMEOUT = 60.0
# The largest document ASO writes out of what users choose (a catalog block, a monitoring
# summary), as JSON: half CouchDB's default max_document_size (8,000,000 bytes, measured on the
# document's Erlang form, ~2x its JSON: aso/provision/store_check.py). Over it, CouchDB refuses the
# write (413) and every other document of its `_bulk_docs` with it.
MAX_WRITTEN_DOC_CHARS = 4_000_000
# A document written through the front end is bounded as JSON (its own fields, as
# aso/model.py doc_chars measures them) before the store parses it: a request by what the model
# takes (model.MAX_DOC_CHARS, the sum of its fields' bounds with room to spare), any other
# document by MAX_WRITTEN_DOC_CHARS (aso/frontend/routes.py Document.max_chars; over it: 413).
# The smallest publisher.max_block_bytes: a block of one file always fits (a file's entry is at
# most aso/model.py MAX_PUBLISH_INFO_CHARS of publish_info and its LFN and figures).
MIN_BLOCK_BYTES = 100_000
