"""All access to the document store: the one module that speaks the CouchDB 3 HTTP API.

Built on IBM's maintained CouchDB client (`ibmcloudant`, the successor of python-cloudant), whose
requests session gives connection pooling; retries with exponential backoff and jitter on
connection errors, 429 and 5xx are urllib3's, mounted on that session.

The contract is Apache CouchDB 3. The embedded store (pouchdb-server 4.2.0) differs in places;
every difference ASO must handle is handled here, once, under a name starting with EMBEDDED_,
and nothing in ASO relies on behaviour that only one of the two stores has:

EMBEDDED_BULK_RESULT_ORDER       `_bulk_docs` answers refused documents first: results are matched
                                 to documents by id, never by position (`Database.bulk_write`).
EMBEDDED_FEED_NEVER_TIMES_OUT    a `_changes` long poll ignores `timeout` and hangs until a change:
                                 the client ends it with its own read timeout (`Database.changes`).
EMBEDDED_CHANGES_FILTER_CRASH    `filter=_design`, `_selector`, `_view`, an unknown filter, a
                                 `selector` or `view` parameter, or `_doc_ids` without its ids
                                 kill the server (and `_selector` answers nothing when it does
                                 not): `Database.changes` offers only `doc_ids`, always with the
                                 ids; the front end refuses the rest (aso/routes.py), and so does
                                 the store's request guard (EMBEDDED_REQUEST_GUARD), 400.
EMBEDDED_OPEN_SECURITY           a new database is open to anonymous writers: `Server.create_db`
                                 always sets `_security` in the same call.
EMBEDDED_CRASH_ON_NON_ADMIN_DB_CREATE  (found here) a non-admin `PUT /db` (or `DELETE /db`) kills
                                 the server process: `Server.create_db` refuses to send it without
                                 admin credentials; the request guard answers anyone else's 401.
EMBEDDED_NEEDS_CONTENT_TYPE      bodies without `Content-Type: application/json` are misread: every
                                 request here sends it (the client library does, `_raw` too).
EMBEDDED_DELETE_WITHOUT_REV      DELETE without rev deletes the current revision: `Database.delete`
                                 takes the revision as a required argument.
EMBEDDED_DELETE_WRONG_REV_404    (found here) DELETE with a stale revision answers 404 there,
                                 409 on CouchDB: `Database.delete` reports a Conflict on both.
EMBEDDED_INTEGER_SEQ             `seq` values are integers there, opaque strings on CouchDB: they
                                 are turned into strings and never compared or parsed.
EMBEDDED_CHANGES_ORDER           feeds come in write order there, shard-interleaved on a cluster:
                                 nothing here assumes an order inside a batch.
EMBEDDED_PREDICTABLE_REVS        (found here) revision ids are not random there: the md5 of the
                                 document as written (with the `_rev` it is based on), so a client
                                 knows the revision a write will get before it is made. Revisions
                                 are only echoed back here; nothing relies on their being
                                 unguessable (EMBEDDED_VALIDATES_BEFORE_CONFLICT).
EMBEDDED_MAP_ONLY_REDUCE         `reduce=true` on a map-only view is 400 on CouchDB and ignored
                                 there: `Database.view` sends reduce/group only when asked to.
EMBEDDED_NO_STARTKEY_DOCID       `startkey_docid` and view `offset` are ignored there: nothing here
                                 sends or reads them; pages are cut by key ranges.
EMBEDDED_ERROR_REASONS           error `reason` texts differ: code branches on status and `error`.
EMBEDDED_STALE_PARAM             (found here) `update=false`/`stable` are ignored there and the view
                                 is rebuilt: stale reads send `stale=ok|update_after` there and
                                 `stable=true&update=false|lazy` to CouchDB (`Database.view`).
EMBEDDED_GZIP_BODIES             (found here) `/_config` there does not inflate gzip request
                                 bodies, which the client library sends by default: off.
EMBEDDED_CONFIG_PATH             the server configuration lives at `/_config` there and at
                                 `/_node/{node}/_config` on CouchDB 3 (`Server.node_config`,
                                 `Server.set_server_admin`); its sections differ too (no
                                 [chttpd], [chttpd_auth] or [cluster]).
EMBEDDED_VALIDATES_BEFORE_CONFLICT  (found here) a write based on a revision that is not the
                                 current one (a create of an existing id, a stale update, a
                                 revision made up or made earlier in the same `_bulk_docs`) is
                                 judged by validate_doc_update against the current document
                                 before the store looks for a conflict, and stored on the revision
                                 it names if that exists by then: a forged write based on the
                                 revision the owner's kill in the same batch would get
                                 (EMBEDDED_PREDICTABLE_REVS) was stored unjudged while the
                                 validation let such writes pass. CouchDB finds the conflict
                                 first (409) and never asks. The validation refuses every such
                                 write by a user or an agent itself, as a 403 whose reason starts
                                 with "[conflict] " (validate_doc_update.js checkCurrent); this
                                 module turns that refusal into CouchDB's answer, a Conflict (409
                                 `conflict`) from single writes (`_from_api`) and a conflict
                                 result from `Database.bulk_write`, so every writer reads again as
                                 on CouchDB; the front end does the same for its clients.
EMBEDDED_CRASH_ON_NON_ADMIN_MAINTENANCE  (found by tests/test_hostile.py) a non-admin POST
                                 /db/_compact or /db/_view_cleanup kills the server process
                                 (an unhandled 401): the front end never forwards them
                                 (aso/routes.py); the request guard answers a non-admin's 401.
EMBEDDED_500_ON_MALFORMED_DOCS   (found by tests/test_hostile.py) a document with an unknown "_"
                                 member, a `_bulk_docs` entry that is not an object, or (before
                                 validate_doc_update checked it) a non-string `_id` is a 500 there,
                                 a 400 on CouchDB: the front end refuses them with a 400
                                 (aso/routes.py), upload() never sends them (aso/upload.py). The
                                 request guard refuses `docs` that is no list of objects and
                                 `_attachments`/`_revisions` of another shape (400).
EMBEDDED_DROPS_PROTO_MEMBERS     (found by tests/test_hostile.py) a member named `__proto__`
                                 inside a document (a lumi run) is dropped without a word: the
                                 store keeps another document than the one it answered 201 for.
                                 The model refuses such members; the front end and upload() never
                                 send them.
EMBEDDED_USERCTX_HAS_NO_DB       `userCtx.db` is missing in validate_doc_update: never read it
                                 (couchapp/asyncstageout/validate_doc_update.js).
EMBEDDED_IGNORES_PROXY_AUTH      proxy-authentication headers are ignored: identity forwarding is
                                 the front end's business and uses basic auth with per-user
                                 accounts on the embedded store.
EMBEDDED_VIEW_KEYS_INEXACT       (found by tests/test_pages.py under load) a view row's `key` is
                                 decoded from the index's sortable text, and a number of 17
                                 significant digits (a time to the microsecond) may come back one
                                 or two units in the last place off: a page that starts the next
                                 page at the row's key may skip that row. Rows are compared in
                                 the index by the emitted value, exactly, so a next page starts at
                                 a value the row carries in its `value` (the user page's
                                 failures: couchapp/users/views/failures, `at`).
EMBEDDED_SINGLE_NODE             (found by aso store check) `/_membership` answers one fixed node
                                 and `GET /db` has no `cluster` member: there is one copy of each
                                 document and q/n do not apply (aso/store_check.py says so).
EMBEDDED_NO_ATTACHMENTS_CSP      attachments come without the Content-Security-Policy CouchDB sends
                                 (COUCHDB_ATTACHMENTS_CSP): the embedded store's node loads
                                 deploy/store/attachments-csp.js first, which adds ASO's policy to
                                 design documents' attachments (aso/local/embedded.py), so the
                                 pages run under the same policy on both stores.
EMBEDDED_VIEW_CONTEXT_PER_DOCUMENT  (found here, profiling a view build) pouchdb-mapreduce
                                 compiles a view's map function anew for every document, in a new
                                 V8 context: ~1.3 ms per document and view, ~780 documents/s per
                                 view build. The embedded store's node loads
                                 deploy/store/view-functions.js first, which compiles each
                                 function once per view update, in a sandbox of its own
                                 (aso/local/embedded.py; tests/test_store.py: what the functions
                                 see, on both stores).
EMBEDDED_REQUEST_GUARD           the embedded store's node loads deploy/store/request-guard.js
                                 first (aso/local/embedded.py): after authentication, before any
                                 route, it refuses with a 4xx in CouchDB's shape what the store
                                 gets wrong, whoever sends it (the front end, an agent, anything
                                 on loopback); the entries below and
                                 EMBEDDED_CHANGES_FILTER_CRASH, EMBEDDED_CRASH_ON_NON_ADMIN_*,
                                 EMBEDDED_500_ON_MALFORMED_DOCS name each case, and
                                 tests/test_embedded_guard.py sends each straight to its port.
                                 A server where its hooks did not take refuses to listen.
EMBEDDED_LATEST_CRASH            (found by a hostile user) `latest` with a revision the document
                                 lacks (`?latest=true&rev=1-x`, `open_revs`, `_bulk_get`) kills
                                 the server: the guard serves it only as `open_revs=all&latest=
                                 true` (Database.leaves: no revision named), 400 otherwise.
EMBEDDED_CHANGES_DOC_IDS_CRASH    (found by a hostile user) a `_changes` body or query whose
                                 `doc_ids` is no list (`1`, `true`, `{}`) kills the server: the
                                 guard wants a list of strings, 400.
EMBEDDED_REVS_DIFF_CRASH         (found here) a `_revs_diff` entry that is no list kills the
                                 server: the guard wants lists of revisions, 400.
EMBEDDED_LIST_CRASH              (found here) `_list` with a missing list function kills the
                                 server: ASO has no list functions; the guard refuses `_list`, 403.
EMBEDDED_LOG_CRASH               (found here) `/_log?bytes=x` (server admins) kills the server:
                                 the guard wants non-negative integers, 400.
EMBEDDED_NAMES_UNCHECKED         (found by a hostile user) database names are stripped of NUL and
                                 `"` (`/%00_replicator` is `_replicator`) and names CouchDB refuses
                                 are served: the guard applies CouchDB's rule after
                                 percent-decoding (`^[a-z][a-z0-9_$()+/-]*$`, or a system database
                                 or server endpoint), 400 `illegal_database_name`.
EMBEDDED_REPLICATE_ANYONE        (found here) `POST /_replicate` needs no account: anyone copied
                                 `_users` (password hashes) into a database anyone reads, or any
                                 database to any address: the guard answers all but server admins
                                 401. ASO does not replicate.
EMBEDDED_OPEN_SYSTEM_DATABASES   (found by a hostile user) `_users` and `_replicator` (created at
                                 start) have an empty `_security`: any store user wrote a
                                 replication document, which made the store connect to any
                                 address it named (one with `"retry": false` and a refused target
                                 kills it at every start). `aso db init` keeps every system
                                 database to the admin (designdocs.SYSTEM_SECURITY), `aso store
                                 check` reports one that is open, and the guard lets only server
                                 admins write to a system database (403).
EMBEDDED_USERS_SELF_ADMIN        (found here) a user who writes their own `_users` document is
                                 `_admin` for that request and gave themselves any role
                                 (`aso-admin` too), `_security` notwithstanding: only server admins
                                 write to `_users` there (the guard, 403).
EMBEDDED_LOCAL_UNVALIDATED       (found by a hostile user) validate_doc_update is skipped for any
                                 id starting with `_local` (`_localx` too), and a database's
                                 `_security` is the document `_local/_security`: a member who
                                 wrote it (PUT, `_bulk_docs`, POST, COPY, multipart, `?id=`) made
                                 themselves the database's admin. The guard lets only server
                                 admins write documents whose id starts with `_` (403); nothing
                                 of ASO writes `_local` documents.
EMBEDDED_DESIGN_FUNCTIONS_UNSANDBOXED  (found here) validate_doc_update, shows and updates of a
                                 design document run with a plain eval in the server's process
                                 (couchdb-eval): writing a design document (db admins may on
                                 CouchDB, `_index` makes one) ran code as the store's user. Only
                                 server admins write design documents there (`aso db init`).
EMBEDDED_TEMP_VIEW_RUNS_CODE     (found here) `POST /db/_temp_view` evaluates the body's map
                                 function before any check of who sent it, in a context it
                                 escapes: anyone ran code in the store. CouchDB 3 has no
                                 temporary views: the guard answers 410 as it does.
EMBEDDED_VIEW_KEYS_UNCHECKED     (found by a hostile user) view or `_all_docs` `keys` that is no
                                 list (and `open_revs` neither "all" nor a list) is a 500: the
                                 guard answers 400.
EMBEDDED_UNBOUNDED_BATCHES       (found by a hostile user) 100,000 view keys stall the one
                                 process 14-17 s for everyone: a store user's keys, doc_ids,
                                 `_bulk_docs`/`_bulk_get` documents are at most 1000 there
                                 (MAX_BATCH in deploy/store/request-guard.js, the front end's
                                 maxItems); server admins and the agent role are not bounded (ASO's
                                 own batches follow its configuration).
EMBEDDED_SECURITY_UNCHECKED      (found here) a `_security` of another shape (`"members": 1`) is
                                 stored and breaks every later request to the database: the guard
                                 wants objects of `names`/`roles` lists, 400.
EMBEDDED_FEEDS_NEVER_RELEASED    (found by a hostile user) a continuous feed's listener and
                                 heartbeat timer stay after the client has gone: 100 closed feeds
                                 made a write's median 9 → 43 ms, 400: 129 ms; 20 with
                                 `heartbeat=1` took idle CPU from 1 % to 23 %. The guard cancels a
                                 request's feeds and timers when its connection closes, and
                                 answers CouchDB's `clients_requesting_changes` stat with the live
                                 listeners (tests/test_store.py, on both stores).
EMBEDDED_HEARTBEAT_BUSY          (found by a hostile user) a feed's `heartbeat` of 1 ms writes a
                                 newline every millisecond: the guard wants at least 100 ms, 400.
EMBEDDED_REPLICATION_CRASH_AT_START  (found by a hostile user) a replication document with
                                 `"retry": false` and a refused target kills the server at every
                                 start: only the admin can write one now
                                 (EMBEDDED_OPEN_SYSTEM_DATABASES); `aso run` ends the crash loop
                                 of a store that dies again and again (aso/supervisor.py).
EMBEDDED_NO_CSRF_CHECK           (found by the red team) a form post (`multipart/form-data` to a
                                 design document: an attachment upload) from any site's page was
                                 taken with the session cookie of whoever had the monitoring pages
                                 open (the store's admin, often): another site wrote the pages.
                                 CouchDB wants a Referer of its own host for such a post. The
                                 guard refuses a write from another site (Sec-Fetch-Site,
                                 Origin), and one in a type a page posts without asking (a form,
                                 text/plain) without an Origin or Referer of this host, 403
                                 (tests/test_store.py, both stores).
EMBEDDED_CORS_OPEN               (found by the red team) CORS is on for every origin, with
                                 credentials: another site's page could read and write with the
                                 session. The guard turns pouchdb-server's CORS middleware off
                                 and drops any Access-Control-* header (CouchDB: no CORS).
EMBEDDED_SESSION_COOKIE_CROSS_SITE  (found by the red team) the session cookie has no SameSite
                                 and no HttpOnly: the guard adds `SameSite=Strict; HttpOnly`, as
                                 ASO's CouchDB settings give it (`[chttpd_auth] same_site`).
EMBEDDED_LONGPOLL_CANCELLED_READ (found by the red team) a long poll's first, one-off read
                                 cancelled (its client left) resolves with no `results`, which
                                 the changes route reads: the store dies. The request guard
                                 cancels only live feeds when their client leaves.
EMBEDDED_KEYS_READ_WHOLE         (found by the red team) a view read by `keys` reads every
                                 row of every key (a key named twice, twice) and, with
                                 include_docs, the documents of all of them, before it applies
                                 `limit`: 100 copies of a key built 850 MB and ended the store.
                                 The front end takes distinct keys only, and no include_docs
                                 with a view's keys (aso/routes.py VIEW_RULES).
EMBEDDED_SINGLE_PROCESS          one Node.js process serves every request and builds every view,
                                 one view per pass (../STORE-NOTES: ~5,100 docs/s bulk inserts):
                                 one machine's load, and a crash
                                 (EMBEDDED_CHANGES_FILTER_CRASH, ...) stops all of it.

Apache CouchDB 3 itself, and a cluster of it, have behaviour a client must handle too; each is
named here (COUCHDB_ and CLUSTER_), handled once, and tested on CouchDB (`make test` runs the
suite on both stores):

COUCHDB_FOREIGN_ARRAYS           the query server runs each document in a JavaScript context of
                                 its own: `x instanceof Array` is false for the document's arrays.
                                 ASO's store-side functions use `Array.isArray`
                                 (tests/test_validation.py checks every one of them).
COUCHDB_ATTACHMENTS_CSP          attachments are served with `Content-Security-Policy: sandbox`:
                                 the monitoring pages' script does not run. The local CouchDB
                                 (aso/couchdb.py) and deploy/couchdb/local.ini set a policy that
                                 lets the pages' own files run; `aso store check` reports it.
COUCHDB_REQUIRE_VALID_USER       `require_valid_user` answers 401 to anonymous `GET /` and `/_up`:
                                 liveness probes take any HTTP answer as "up"
                                 (aso/localstore.answers_http).
COUCHDB_SECURITY_NO_MAJORITY     a non-admin's `PUT /db/_security` answers `500 no_majority`: it
                                 is sent once, not retried as a 5xx, and reported as Forbidden
                                 when the account is no admin of the database
                                 (`Database.set_security`); the front end refuses such writes
                                 with a 403 before the store sees them (aso/routes.py).
COUCHDB_REFUSES_MALFORMED_FIRST  a body that is no valid UTF-8 (a lone surrogate in a \\ud800
                                 escape) or a non-string `_id` is a 400 before validate_doc_update
                                 runs; the embedded store judged or kept it. The model refuses
                                 both (aso/model.py, validate_doc_update.js), so the same
                                 documents are refused on both stores.
COUCHDB_BULK_NOT_ATOMIC          a `_bulk_docs` that fails midway (a full disk, a node going away)
                                 may have written part of its documents: every bulk writer is
                                 idempotent (upload() reports them as already recorded, agents
                                 read again and decide again).
COUCHDB_STOPS_ON_FULL_DISK       a node whose database files cannot be written answers 500
                                 (enospc) for a while, then stops: clients see a store that went
                                 away (retryable); it is started again once there is room
                                 (tests/test_disk_full.py).
COUCHDB_REQUEST_SIZE_LIMIT       (found by `make bench-pages` with 1M requests) a request body
                                 over `[chttpd] max_http_request_size` (64 MB in ASO's settings)
                                 is refused whole, 413, where the embedded store takes up to
                                 4 GB: the analytics' first summaries of a million requests
                                 wrote 2,000 documents of ~170 kB in one `_bulk_docs` (89 MB)
                                 and stopped there. Nothing of a refused body is written:
                                 `Database.bulk_write` sends such a write again in halves,
                                 down to the store's own limit, whatever it is set to.
COUCHDB_SEQ_MAKES_ATOMS          (found by the red team) `since` is decoded with an unchecked
                                 `binary_to_term`: every atom it names is made and never
                                 collected, and the node ends when its atom table is full (768
                                 requests of ~1,400 made-up names). The front end forwards a
                                 `since` only when its atoms are the store's own nodes
                                 (aso/sequences.py, `FrontEnd._check_nodes`).
COUCHDB_DOCUMENT_SIZE_LIMIT      (found by the red team) a document over
                                 `[couchdb] max_document_size` (8 MB in ASO's settings) makes
                                 CouchDB refuse the whole `_bulk_docs` with 413
                                 `document_too_large`, naming none of the others; the embedded
                                 store takes documents up to its request size (4 GiB). The
                                 halving above ends at that one document, whose result says
                                 `document_too_large`; the others are written. What ASO writes
                                 is bounded below that (catalog blocks: publisher.max_block_bytes;
                                 summaries: aso/summaries.py TASKS_CAP).
COUCHDB_FEED_ENDS_AT_TIMEOUT     a quiet long poll ends at `timeout` with no results and a
                                 `last_seq` of its own: it is a timed-out batch, as when our read
                                 timeout ends a poll on the embedded store (`Database.changes`).
COUCHDB_POST_IGNORES_REV         `POST /db` of a document without `_id` makes a new document and
                                 drops the `_rev` it carries (the embedded store keeps it, and its
                                 validation refuses it as a conflict): ASO's writes name their
                                 ids; tests/test_hostile.py judges such a write as each store
                                 sees it.
CLUSTER_ACCEPTED_IS_NOT_WON      a cluster answers a write that fewer copies than the quorum
                                 stored with 202 (`accepted: true` per document of a
                                 `_bulk_docs`): two agents writing the same revision through two
                                 nodes may both be "accepted" (found by a 3-node lifecycle run:
                                 two submitters acquired one file, both copied it). Such a write
                                 is reported as a conflict (`Contested`, a result with
                                 `accepted`), so no agent acts on it; it is withdrawn when
                                 another branch beats it in CouchDB's order, kept when nothing
                                 does (`Database.withdraw_if_beaten`). Only a majority write
                                 (201) is won, and two writers cannot both have a majority.
CLUSTER_CONFLICTING_BRANCHES     such writes leave a document with conflicting branches. The
                                 winner CouchDB shows is the longest branch, the one an agent
                                 went on with; the purge withdraws a request's other branches
                                 with it (else one would become the document again,
                                 aso/purge.py); the reconciler reports a conflict left quiet for
                                 twice the lease and `--fix` keeps the winner (`keep_leaf`). An
                                 agent may delete an unfinished request's revision only as such
                                 a withdrawal (`withdrawn`, validate_doc_update.js). The monitor
                                 settles a request's other branches before its file goes on (a
                                 branch's job is followed, or fenced and the branch withdrawn),
                                 and a job and its fence on two branches read as one
                                 (aso/transfer/jobstore.merged).
CLUSTER_READ_MAY_MISS            a read of many documents (`_all_docs` by keys) may answer "not
                                 found" for a document a cluster holds (written below the quorum,
                                 or on a shard copy a restarted node has not caught up): absence
                                 is never acted on from such a read. A job not found is fenced
                                 first (aso/transfer/jobstore.py: a write at the quorum, which
                                 conflicts if the job is there), and a request's other branches
                                 are settled before its file goes on (agents/monitor.py).
CLUSTER_SHARD_INTERLEAVED_FEEDS  `_changes` of a q>1 database comes shard by shard, and after a
                                 node restart a feed may replay changes from an older point:
                                 every feed reader treats `seq` as opaque, reads documents as
                                 they are now and is idempotent (EMBEDDED_CHANGES_ORDER).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import quote, urlsplit

import requests
from ibm_cloud_sdk_core import ApiException
from ibm_cloud_sdk_core.authenticators import BasicAuthenticator, NoAuthAuthenticator
from ibmcloudant.cloudant_v1 import CloudantV1
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from aso import gridenv, metrics
from aso.limits import MAX_DOCS, MAX_KEYS
from aso.model import WITHDRAWN

log = logging.getLogger("aso.store")

COUCHDB = "couchdb"
EMBEDDED = "pouchdb-server"
JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}
RETRY_STATUSES = (429, 500, 502, 503, 504)
FEED_MARGIN = 2.0  # seconds a long poll may outlive its `timeout` before the client ends it


# --- errors ----------------------------------------------------------------------------------
class StoreError(Exception):
    """The store answered with an error (status, CouchDB `error` and `reason`)."""

    def __init__(self, status: int, error: str, reason: str = "", url: str = ""):
        self.status, self.error, self.reason, self.url = status, error, reason, url
        super().__init__(f"{status} {error}: {reason}" if reason else f"{status} {error}")

    @property
    def retryable(self) -> bool:
        """The same call may succeed later: the store unreachable (0), overloaded or failing
        (408, 429, 5xx), or out of space (507; CouchDB answers a full disk with a 500)."""
        return self.status in (0, 408, *RETRY_STATUSES, 507)


class StoreUnavailable(StoreError):
    """The store could not be reached (after the configured retries)."""

    def __init__(self, url: str, detail: str):
        super().__init__(0, "unavailable", f"cannot reach the store at {url}: {detail}", url)

    def __str__(self) -> str:
        return self.reason


class Unauthorized(StoreError):
    pass


class Forbidden(StoreError):
    pass


class NotFound(StoreError):
    pass


class Conflict(StoreError):
    pass


class Contested(Conflict):
    """CLUSTER_ACCEPTED_IS_NOT_WON: the write was stored by fewer copies than the cluster's
    quorum (HTTP 202, `accepted`): another writer of the same revision may have won. Treated as
    a conflict: the writer does not act on it."""

    def __init__(self, url: str = "", rev: str | None = None):
        super().__init__(409, "conflict", ACCEPTED_REASON, url)
        self.rev = rev


ACCEPTED_REASON = "accepted by fewer copies than the quorum: another writer may have won"


_BY_STATUS = {401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict}
# EMBEDDED_VALIDATES_BEFORE_CONFLICT: how the validation's refusal of a write based on another
# revision than the current one begins (CouchDB answers such a write 409 before validating).
CONFLICT_REFUSAL = "[conflict] "


def refused_as_conflict(error: str | None, reason: str | None) -> bool:
    """A `forbidden` answer that is the validation's conflict (a 409 on CouchDB)."""
    return error == "forbidden" and (reason or "").startswith(CONFLICT_REFUSAL)


# A bulk write's per-document `error`, with the status a single write of that document answers.
_BULK_ERROR_STATUS = {
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "conflict": 409,
    "too_large": 413,
    "document_too_large": 413,
}


def too_large(doc: Mapping[str, Any], exc: StoreError) -> dict[str, Any]:
    """The `_bulk_docs` result of a document the store refused as too large (413)."""
    return {"id": doc.get("_id"), "error": exc.error or "too_large", "reason": exc.reason}


def _short(exc: BaseException) -> str:
    """The innermost cause of a connection error, on one line."""
    text = str(exc)
    for marker in ("Caused by ", "] "):
        if marker in text:
            text = text.rsplit(marker, 1)[-1]
    return text.strip("()'\" ")[:200]


def _count_conflict(url: str) -> None:
    """One more conflict in the store's metrics, for the route of `url`."""
    db, route = metrics.store_route(urlsplit(url).path)
    metrics.STORE_CONFLICTS.labels(db, route).inc()


def _from_api(exc: ApiException, url: str = "") -> StoreError:
    body: dict[str, Any] = {}
    response = exc.http_response
    if response is not None:
        try:
            parsed = response.json()
            body = parsed if isinstance(parsed, dict) else {}
        except ValueError:
            body = {}
    error = str(body.get("error") or exc.message or "error")
    reason = str(body.get("reason") or "")
    if exc.status_code == 403 and refused_as_conflict(error, reason):
        if response is not None:  # the response hook counted a 403, not a conflict
            _count_conflict(response.request.url or "")
        return Conflict(409, "conflict", reason, url)
    cls = _BY_STATUS.get(exc.status_code, StoreError)
    return cls(exc.status_code, error, reason, url)


@dataclass(frozen=True)
class WriteResult:
    """Outcome of one document of a bulk write."""

    id: str
    ok: bool
    rev: str | None = None
    error: str | None = None  # conflict, forbidden, unauthorized, ...
    reason: str | None = None
    # CLUSTER_ACCEPTED_IS_NOT_WON: stored (as `rev`) by fewer copies than the quorum: reported
    # as a conflict, not ok, so that no caller acts on it.
    accepted: bool = False

    @property
    def conflict(self) -> bool:
        return self.error == "conflict"

    def as_error(self, url: str = "") -> StoreError:
        """This document's failure as the error a single write of it raises (same status, class
        and text: "403 forbidden: reason"), so that a refusal reads the same whichever way it
        came. An error the store names nothing else becomes 400: the write is not retried."""
        error = self.error or "error"
        status = _BULK_ERROR_STATUS.get(error, 400)
        return _BY_STATUS.get(status, StoreError)(status, error, self.reason or "", url)


@dataclass
class Decided:
    """Outcome of `Database.write_decided`."""

    written: list[dict[str, Any]] = field(default_factory=list)  # as written, with the new _rev
    declined: list[dict[str, Any]] = field(default_factory=list)  # fresh docs decided against
    gone: list[str] = field(default_factory=list)  # deleted meanwhile
    refused: list[WriteResult] = field(default_factory=list)  # forbidden and other errors
    conflicted: list[str] = field(default_factory=list)  # still in conflict after every round

    @property
    def not_written(self) -> list[str]:
        return (
            [d["_id"] for d in self.declined]
            + self.gone
            + [r.id for r in self.refused]
            + self.conflicted
        )


@dataclass
class ChangesBatch:
    results: list[dict[str, Any]]
    last_seq: str  # opaque (EMBEDDED_INTEGER_SEQ)
    timed_out: bool = False


@dataclass
class ViewResult:
    rows: list[dict[str, Any]]
    total_rows: int | None = None

    def docs(self) -> list[dict[str, Any]]:
        return [row["doc"] for row in self.rows if row.get("doc")]


@dataclass
class Settings:
    """How the client talks to the store (filled from the [store] section of the config)."""

    connect_timeout: float = 5.0
    read_timeout: float = 120.0
    retries: int = 5
    backoff: float = 0.5
    backoff_max: float = 30.0
    pool_size: int = 16
    feed_timeout: float = 30.0

    @classmethod
    def of(cls, store: Any) -> Settings:
        """From the [store] section of the config."""
        return cls(
            connect_timeout=store.connect_timeout,
            read_timeout=store.read_timeout,
            retries=store.retries,
            backoff=store.backoff,
            backoff_max=store.backoff_max,
            pool_size=store.pool_size,
            feed_timeout=store.feed_timeout,
        )


def _session(
    settings: Settings, retries: int, read_retries: int, status_retries: int
) -> requests.Session:
    retry = Retry(
        total=retries,
        connect=retries,
        read=read_retries,
        status=status_retries,
        backoff_factor=settings.backoff,
        backoff_max=settings.backoff_max,
        backoff_jitter=settings.backoff / 2,
        status_forcelist=RETRY_STATUSES,
        # Writes are retried too: a repeated write with the revision it read can only end in a
        # 409, which callers treat as "someone else got there"; a create is idempotent by id.
        allowed_methods=None,
        raise_on_status=False,
        respect_retry_after_header=True,
    )
    adapter = HTTPAdapter(
        pool_connections=2, pool_maxsize=settings.pool_size, max_retries=retry, pool_block=False
    )
    session = requests.Session()
    session.hooks["response"].append(metrics.observe_store_response)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


class Server:
    """A CouchDB-API server, as one account (admin, agent or user)."""

    def __init__(
        self,
        url: str,
        user: str = "",
        password: str = "",
        settings: Settings | None = None,
        *,
        verify: bool | str = True,
        cert: str | tuple[str, str] | None = None,
    ):
        """`cert`: an X.509 client credential (a proxy file, or certificate and key) for the
        front end, which then knows who this is: user and password are not sent."""
        self.url = url.rstrip("/")
        self.user = "" if cert else user
        self.settings = settings or Settings()
        self._password = password
        self._kind: str | None = None
        self._verify, self._cert = verify, cert
        self.client = self._client(self.settings.read_timeout, verify, read_retries=True)
        self._feed_client: CloudantV1 | None = None
        self._single_shot_client: CloudantV1 | None = None

    def _client(
        self,
        read_timeout: float | None,
        verify: bool | str,
        *,
        read_retries: bool,
        status_retries: bool = True,
    ) -> CloudantV1:
        auth = BasicAuthenticator(self.user, self._password) if self.user else NoAuthAuthenticator()
        client = CloudantV1(authenticator=auth)
        client.set_service_url(self.url)
        # EMBEDDED_GZIP_BODIES: the client library gzips request bodies by default; some
        # embedded-store routes (/_config) do not inflate them.
        client.set_enable_gzip_compression(False)
        retries = self.settings.retries
        client.set_http_client(
            _session(
                self.settings,
                retries,
                retries if read_retries else 0,
                retries if status_retries else 0,
            )
        )
        config: dict[str, Any] = {}
        if read_timeout is not None:
            config["timeout"] = (self.settings.connect_timeout, read_timeout)
        if verify is not True:
            config["verify"] = verify
        if self._cert:
            config["cert"] = self._cert
        client.set_http_config(config)
        return client

    @property
    def feed_client(self) -> CloudantV1:
        """A second client for long polls: no read retries (a poll cut by its read timeout is
        simply over) and no fixed read timeout (each poll passes its own)."""
        if self._feed_client is None:
            self._feed_client = self._client(None, self._verify, read_retries=False)
        return self._feed_client

    @property
    def single_shot_client(self) -> CloudantV1:
        """A client that does not repeat a request the store answered with a 5xx (it still
        retries connection errors): for answers that a retry cannot change."""
        if self._single_shot_client is None:
            self._single_shot_client = self._client(
                self.settings.read_timeout, self._verify, read_retries=True, status_retries=False
            )
        return self._single_shot_client

    @classmethod
    def from_config(cls, config: Any, *, account: str = "user") -> Server:
        """`account`: "admin" (server admin), "agent" (agent account) or "user" (everyday)."""
        store = config.store
        user, password = {
            "admin": (store.admin_user, store.admin_password),
            "agent": (store.agent_user, store.agent_password),
            "user": config.store_user,
        }[account]
        settings = Settings.of(store)
        if store.auth == "x509":
            # Through the front end: the certificate says who this is, whatever the account.
            path = config.path
            credential = gridenv.client_credential(
                str(path(store.x509_proxy)) if store.x509_proxy else "",
                str(path(store.x509_cert)) if store.x509_cert else "",
                str(path(store.x509_key)) if store.x509_key else "",
            )
            capath = gridenv.ca_directory(
                str(path(store.x509_cert_dir)) if store.x509_cert_dir else ""
            )
            return cls(store.url, settings=settings, verify=capath, cert=credential)
        return cls(store.url, user, password, settings)

    # -- calling ------------------------------------------------------------------------------
    def call(self, fn: Any, *args: Any, _poll: bool = False, **kwargs: Any) -> Any:
        """Run one client-library call, turning its failures into StoreError subclasses
        (`_poll`: a long poll, which the client's read timeout may end as planned)."""
        try:
            return fn(*args, **kwargs).get_result()
        except ApiException as exc:
            raise _from_api(exc, self.url) from None
        except requests.exceptions.Timeout as exc:
            if not _poll:
                metrics.STORE_UNAVAILABLE.inc()
            raise StoreUnavailable(self.url, f"timed out ({_short(exc)})") from None
        except requests.exceptions.RequestException as exc:
            metrics.STORE_UNAVAILABLE.inc()
            raise StoreUnavailable(self.url, _short(exc)) from None

    def raw(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        client: CloudantV1 | None = None,
        timeout: tuple[float, float] | None = None,
        poll: bool = False,
    ) -> Any:
        """A request the typed API lacks, through the same pooled, retrying session (`poll`: a
        long poll that our read timeout may end)."""
        client = client or self.client
        data = None if body is None else json.dumps(body)
        request = client.prepare_request(
            method, path, headers=dict(JSON_HEADERS), params=dict(params or {}), data=data
        )
        extra = {"timeout": timeout} if timeout else {}
        return self.call(lambda: client.send(request, **extra), _poll=poll)

    def raw_answer(
        self, method: str, path: str, *, params: Mapping[str, Any] | None = None, body: Any = None
    ) -> tuple[int, Any]:
        """As `raw`, with the HTTP status of the answer (201 or 202 for a write)."""
        data = None if body is None else json.dumps(body)
        request = self.client.prepare_request(
            method, path, headers=dict(JSON_HEADERS), params=dict(params or {}), data=data
        )
        answer: list[int] = []

        def send() -> Any:
            response = self.client.send(request)
            answer.append(response.get_status_code())
            return response

        result = self.call(send)
        return answer[-1], result

    # -- server -------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        return cast(dict[str, Any], self.call(self.client.get_server_information))

    @property
    def kind(self) -> str:
        """COUCHDB or EMBEDDED, from the welcome message (asked once)."""
        if self._kind is None:
            self._kind = kind_of(self.info())
        return self._kind

    def membership(self) -> dict[str, Any]:
        """`GET /_membership`: {all_nodes, cluster_nodes} (EMBEDDED_SINGLE_NODE)."""
        return cast(dict[str, Any], self.raw("GET", "/_membership"))

    def cluster_size(self) -> int:
        """Nodes of the cluster (1: a single CouchDB node or the embedded store)."""
        if self.kind == EMBEDDED:
            return 1  # EMBEDDED_SINGLE_NODE
        return max(1, len(self.membership().get("cluster_nodes", [])))

    def node_config(self, node: str = "_local") -> dict[str, dict[str, str]]:
        """The configuration of one node, {section: {key: value}} (server admin only;
        EMBEDDED_CONFIG_PATH: the embedded store has one, whatever `node` says)."""
        return cast(dict[str, dict[str, str]], self.raw("GET", self._config_path(node)))

    def _config_path(self, node: str) -> str:
        if self.kind == EMBEDDED:
            return "/_config"
        return f"/_node/{quote(node, safe='')}/_config"

    def session(self) -> dict[str, Any]:
        """The userCtx the store gives these credentials."""
        return cast(dict[str, Any], self.raw("GET", "/_session").get("userCtx", {}))

    def is_admin(self) -> bool:
        return "_admin" in (self.session().get("roles") or [])

    def all_dbs(self) -> list[str]:
        return cast(list[str], self.call(self.client.get_all_dbs))

    def db(self, name: str) -> Database:
        return Database(self, name)

    def create_db(self, name: str, security: Mapping[str, Any], *, q: int | None = None) -> bool:
        """Create database `name` (False if it existed) and set its `_security` either way.
        `q`: its shards, on a CouchDB cluster (a single node and the embedded store keep
        their default; a database's q is fixed when it is created)."""
        if not self.is_admin():
            # EMBEDDED_CRASH_ON_NON_ADMIN_DB_CREATE: never send the request that kills the server.
            raise Forbidden(403, "forbidden", f"creating database {name} needs the admin account")
        params = {"q": q} if q and self.cluster_size() > 1 else {}
        try:
            self.raw("PUT", f"/{quote(name, safe='')}", params=params)
            created = True
        except StoreError as exc:
            if exc.status != 412:
                raise
            created = False
        # EMBEDDED_OPEN_SECURITY: a database is never left with the store's default _security.
        self.db(name).set_security(security)
        return created

    def delete_db(self, name: str) -> None:
        self.call(self.client.delete_database, db=name)

    def set_server_admin(self, name: str, password: str) -> None:
        """Create or change a server admin (EMBEDDED_CONFIG_PATH)."""
        self.raw(
            "PUT", f"{self._config_path('_local')}/admins/{quote(name, safe='')}", body=password
        )

    def put_user(self, name: str, password: str, roles: Sequence[str]) -> bool:
        """Create or update a store account in `_users`; True if something changed."""
        users = self.db("_users")
        doc_id = f"org.couchdb.user:{name}"
        current = users.get(doc_id)
        wanted = {"_id": doc_id, "name": name, "type": "user", "roles": sorted(roles)}
        same_roles = current is not None and sorted(current.get("roles", [])) == wanted["roles"]
        if same_roles and self._password_works(name, password):
            return False
        if current:
            wanted["_rev"] = current["_rev"]
        wanted["password"] = password
        users.put(wanted)
        return True

    def _password_works(self, name: str, password: str) -> bool:
        probe = Server(self.url, name, password, Settings(retries=0))
        try:
            return probe.session().get("name") == name
        except StoreError:
            return False


class Database:
    """One database of a Server."""

    def __init__(self, server: Server, name: str):
        self.server = server
        self.name = name
        self.client = server.client

    def __repr__(self) -> str:
        return f"Database({self.server.url}/{self.name})"

    def _call(self, fn: Any, **kwargs: Any) -> Any:
        return self.server.call(fn, db=self.name, **kwargs)

    def info(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._call(self.client.get_database_information))

    def exists(self) -> bool:
        try:
            self.info()
            return True
        except NotFound:
            return False

    # -- single documents -------------------------------------------------------------------
    def get(self, doc_id: str, *, conflicts: bool = False) -> dict[str, Any] | None:
        """One document (a cluster's quorum read), or None; `conflicts`: with the `_conflicts`
        revisions of it (CLUSTER_CONFLICTING_BRANCHES)."""
        params = {"conflicts": "true"} if conflicts else None
        try:
            path = f"/{quote(self.name, safe='')}/{_doc_path(doc_id)}"
            return cast(dict[str, Any], self.server.raw("GET", path, params=params))
        except NotFound:
            return None

    def put(self, doc: Mapping[str, Any]) -> str:
        """Write one document (with `_rev` to update); returns the new revision. Contested (a
        Conflict) when a cluster stored it below its quorum (CLUSTER_ACCEPTED_IS_NOT_WON)."""
        status, result = self.server.raw_answer(
            "PUT", f"/{quote(self.name, safe='')}/{_doc_path(doc['_id'])}", body=dict(doc)
        )
        if status == 202:
            metrics.count_contested(self.name)
            self.withdraw_if_beaten(doc["_id"], result.get("rev", ""))
            raise Contested(self.server.url, result.get("rev"))
        return cast(str, result["rev"])

    # -- a cluster's conflicting branches -------------------------------------------------------
    def leaves(self, doc_id: str) -> list[dict[str, Any]]:
        """Every live leaf revision of a document (`open_revs=all`): one, unless two writers
        of a cluster both stored an edit of the same revision (CLUSTER_CONFLICTING_BRANCHES)."""
        answer = self.server.raw(
            "GET",
            f"/{quote(self.name, safe='')}/{_doc_path(doc_id)}",
            params={"open_revs": "all", "latest": "true"},
        )
        docs = [item["ok"] for item in answer if isinstance(item, dict) and "ok" in item]
        return [d for d in docs if not d.get("_deleted")]

    def withdraw_if_beaten(self, doc_id: str, rev: str) -> bool:
        """CLUSTER_ACCEPTED_IS_NOT_WON: our revision `rev` was stored below the quorum. If
        another live leaf beats it in CouchDB's order (the one that picks the winner), it is
        withdrawn (deleted: a deleted leaf never wins), so that the other writer's edit stays
        the document. A revision nothing beats is kept, whatever others see: the best leaf of
        all never withdraws itself, so a document never loses all its leaves. True if
        withdrawn."""
        try:
            leaves = self.leaves(doc_id)
        except StoreError as exc:
            log.warning("contested write of %s/%s: leaves not read (%s)", self.name, doc_id, exc)
            return False
        if not any(d["_rev"] == rev for d in leaves):
            return False
        if max(leaves, key=lambda d: rev_order(d["_rev"]))["_rev"] == rev:
            return False
        try:
            [result] = self.bulk_write([withdrawal(doc_id, rev)])
        except StoreError as exc:
            log.warning("contested revision %s of %s not withdrawn: %s", rev, doc_id, exc)
            return False
        if not (result.ok or result.accepted):  # a tombstone stored below the quorum is one too
            log.warning("contested revision %s of %s not withdrawn: %s", rev, doc_id, result)
            return False
        log.info(
            "contested revision %s of %s/%s withdrawn: another beats it", rev, self.name, doc_id
        )
        return True

    def withdraw(self, branches: Mapping[str, Sequence[str]]) -> int:
        """CLUSTER_CONFLICTING_BRANCHES: withdraw (delete) the revisions `branches` names per
        document, e.g. the `_conflicts` of documents being purged: a branch left behind would
        become the document once its winner is gone. Returns how many were withdrawn."""
        pending = {doc_id: list(revs) for doc_id, revs in branches.items() if revs}
        withdrawn = 0
        while pending:  # one revision per document and call: bulk_write takes distinct ids
            batch = [withdrawal(doc_id, revs.pop()) for doc_id, revs in pending.items()]
            withdrawn += sum(r.ok or r.accepted for r in self.bulk_write(batch))
            pending = {doc_id: revs for doc_id, revs in pending.items() if revs}
        return withdrawn

    def keep_leaf(self, doc_id: str, keep: str, leaves: Sequence[Mapping[str, Any]]) -> int:
        """CLUSTER_CONFLICTING_BRANCHES: withdraw every live leaf of `leaves` but `keep`; a leaf
        that changed meanwhile is a conflict and stays. Returns how many were withdrawn."""
        return self.withdraw({doc_id: [d["_rev"] for d in leaves if d["_rev"] != keep]})

    def create(self, doc: Mapping[str, Any]) -> str:
        """Create a document; Conflict if its id exists (the caller's duplicate)."""
        if "_rev" in doc:
            raise ValueError("create() takes a document without _rev")
        return self.put(doc)

    def delete(self, doc_id: str, rev: str) -> str:
        """Delete a revision (EMBEDDED_DELETE_WITHOUT_REV: the revision is required)."""
        if not rev:
            raise ValueError("delete() needs the revision being deleted")
        try:
            result = self.server.raw(
                "DELETE", f"/{quote(self.name, safe='')}/{_doc_path(doc_id)}", params={"rev": rev}
            )
        except NotFound:
            # EMBEDDED_DELETE_WRONG_REV_404: a stale revision of a live document is a conflict.
            if self.get(doc_id) is not None:
                raise Conflict(409, "conflict", "Document update conflict.") from None
            raise
        return cast(str, result["rev"])

    # -- bulk -----------------------------------------------------------------------------------
    def get_many(
        self, ids: Iterable[str], *, conflicts: bool = False
    ) -> dict[str, dict[str, Any] | None]:
        """{id: document or None} for every id, in one `_all_docs` request (`conflicts`: with
        the `_conflicts` revisions of each, CLUSTER_CONFLICTING_BRANCHES)."""
        wanted = list(dict.fromkeys(ids))
        extra = {"conflicts": True} if conflicts else {}
        found: dict[str, dict[str, Any] | None] = dict.fromkeys(wanted)
        for start in range(0, len(wanted), MAX_KEYS):
            keys = wanted[start : start + MAX_KEYS]
            result = self._call(self.client.post_all_docs, keys=keys, include_docs=True, **extra)
            for row in result["rows"]:
                if row.get("doc") and not row.get("value", {}).get("deleted"):
                    found[row["key"]] = row["doc"]
        return found

    def all_docs(self, first: str, last: str, limit: int | None = None) -> list[dict[str, Any]]:
        """The documents whose ids run from `first` to `last` (inclusive), in id order."""
        result = self._call(
            self.client.post_all_docs,
            start_key=first,
            end_key=last,
            include_docs=True,
            limit=limit,
        )
        return [row["doc"] for row in result["rows"] if row.get("doc")]

    def _bulk_docs(self, docs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """`_bulk_docs` of at most MAX_DOCS documents each (the front end's bound, whoever
        writes); a body over the store's request size (413, nothing written:
        COUCHDB_REQUEST_SIZE_LIMIT) is sent again in two halves. A document too large alone
        (COUCHDB_DOCUMENT_SIZE_LIMIT) is that document's error only, as a refusal is: the
        others of the write are written."""
        if len(docs) > MAX_DOCS:
            return [
                answer
                for start in range(0, len(docs), MAX_DOCS)
                for answer in self._bulk_docs(docs[start : start + MAX_DOCS])
            ]
        try:
            answer = self._call(
                self.client.post_bulk_docs, bulk_docs={"docs": [dict(d) for d in docs]}
            )
        except StoreError as exc:
            if exc.status != 413:
                raise
            if len(docs) < 2:
                return [too_large(docs[0], exc)]
            half = len(docs) // 2
            return self._bulk_docs(docs[:half]) + self._bulk_docs(docs[half:])
        return cast(list[dict[str, Any]], answer)

    def bulk_write(self, docs: Sequence[Mapping[str, Any]]) -> list[WriteResult]:
        """Write documents in one `_bulk_docs` (in halves if the store finds the body too
        large); one WriteResult per document, in input order.

        A refused document (conflict, forbidden) does not stop the others. Ids must be unique
        within one call: results are matched by id (EMBEDDED_BULK_RESULT_ORDER).
        """
        if not docs:
            return []
        ids = [doc.get("_id") for doc in docs]
        if None in ids or len(set(ids)) != len(ids):
            raise ValueError("bulk_write needs documents with distinct _id")
        answer = self._bulk_docs(docs)
        by_id = {item.get("id"): item for item in answer}
        results = []
        for doc_id in cast(list[str], ids):  # no None: refused above
            item = by_id.get(doc_id)
            if item is None:
                results.append(WriteResult(doc_id, False, error="missing", reason="no result"))
            elif refused_as_conflict(item.get("error"), item.get("reason")):
                # EMBEDDED_VALIDATES_BEFORE_CONFLICT: CouchDB's conflict, as CouchDB answers it
                results.append(
                    WriteResult(doc_id, False, error="conflict", reason=item.get("reason"))
                )
            elif item.get("error"):
                results.append(
                    WriteResult(doc_id, False, error=item["error"], reason=item.get("reason"))
                )
            elif item.get("accepted"):  # CLUSTER_ACCEPTED_IS_NOT_WON
                metrics.count_contested(self.name)
                results.append(
                    WriteResult(
                        doc_id,
                        False,
                        rev=item.get("rev"),
                        error="conflict",
                        reason=ACCEPTED_REASON,
                        accepted=True,
                    )
                )
            else:
                results.append(WriteResult(doc_id, True, rev=item.get("rev")))
        metrics.count_bulk_conflicts(self.name, sum(r.conflict for r in results))
        for result in results:
            if result.accepted and result.rev:
                self.withdraw_if_beaten(result.id, result.rev)
        return results

    def write_decided(
        self,
        docs: Sequence[Mapping[str, Any]],
        decide: Callable[[dict[str, Any]], dict[str, Any] | None],
        rounds: int = 5,
    ) -> Decided:
        """Write `decide(doc)` for each document (None: leave it alone), in bulk. A document that
        conflicts (someone else wrote it since it was read: another agent on another axis) is
        read again and decided again, up to `rounds` times, so that one agent's write never
        undoes another's and is not lost to it either."""
        outcome = Decided()
        pending = [dict(d) for d in docs]
        for _ in range(rounds):
            updates = []
            for doc in pending:
                update = decide(doc)
                if update is None:
                    outcome.declined.append(doc)
                else:
                    updates.append(update)
            conflicts = []
            for update, result in zip(updates, self.bulk_write(updates), strict=True):
                if result.ok:
                    outcome.written.append(dict(update, _rev=result.rev))
                elif result.conflict:
                    conflicts.append(result.id)
                else:
                    outcome.refused.append(result)
            if not conflicts:
                return outcome
            fresh = self.get_many(conflicts)
            outcome.gone.extend(i for i, d in fresh.items() if d is None)
            pending = [d for d in fresh.values() if d is not None]
        outcome.conflicted.extend(d["_id"] for d in pending)
        return outcome

    # -- views ------------------------------------------------------------------------------------
    def view(
        self,
        ddoc: str,
        name: str,
        *,
        key: Any = None,
        keys: Sequence[Any] | None = None,
        start_key: Any = None,
        end_key: Any = None,
        limit: int | None = None,
        skip: int | None = None,
        include_docs: bool = False,
        descending: bool = False,
        reduce: bool | None = None,
        group: bool | None = None,
        group_level: int | None = None,
        freshness: str = "fresh",
    ) -> ViewResult:
        """Query a view. `freshness`: "fresh" (update the index first), "stale" (read the index
        as it is) or "lazy" (read as it is, then update in the background)."""
        params: dict[str, Any] = {}
        for pname, value in (("key", key), ("start_key", start_key), ("end_key", end_key)):
            if value is not None:
                params[pname] = value
        if keys is not None:
            params["keys"] = list(keys)
        if limit is not None:
            params["limit"] = limit
        if skip:
            params["skip"] = skip
        if include_docs:
            params["include_docs"] = True
        if descending:
            params["descending"] = True
        # EMBEDDED_MAP_ONLY_REDUCE: only what the caller asked for.
        for pname, value in (("reduce", reduce), ("group", group), ("group_level", group_level)):
            if value is not None:
                params[pname] = value
        query = self._freshness(freshness)
        path = f"/{quote(self.name, safe='')}/{_doc_path('_design/' + ddoc)}/_view/{quote(name)}"
        result = self.server.raw("POST", path, params=query, body=params)
        return ViewResult(rows=result.get("rows", []), total_rows=result.get("total_rows"))

    def _freshness(self, freshness: str) -> dict[str, str]:
        if freshness == "fresh":
            return {}
        if freshness not in ("stale", "lazy"):
            raise ValueError("freshness is fresh, stale or lazy")
        if self.server.kind == EMBEDDED:  # EMBEDDED_STALE_PARAM
            return {"stale": "ok" if freshness == "stale" else "update_after"}
        return {"stable": "true", "update": "false" if freshness == "stale" else "lazy"}

    # -- changes ----------------------------------------------------------------------------
    def changes(
        self,
        since: str = "0",
        *,
        limit: int | None = None,
        include_docs: bool = False,
        doc_ids: Sequence[str] | None = None,
        wait: float | None = None,
    ) -> ChangesBatch:
        """One batch of the `_changes` feed after `since`.

        `wait`: seconds to wait for a change when there is none (a long poll). The store may not
        end the poll itself (EMBEDDED_FEED_NEVER_TIMES_OUT): the client's read timeout does, and
        an empty batch with the same `since` is returned. No server-side filters other than
        `doc_ids` (EMBEDDED_CHANGES_FILTER_CRASH).
        """
        params: dict[str, Any] = {"since": str(since)}
        body: dict[str, Any] = {}
        if limit is not None:
            params["limit"] = limit
        if include_docs:
            params["include_docs"] = "true"
        if doc_ids is not None:
            params["filter"] = "_doc_ids"
            body["doc_ids"] = list(doc_ids)
        path = f"/{quote(self.name, safe='')}/_changes"
        if not wait:
            result = self.server.raw("POST", path, params=params, body=body)
            return ChangesBatch(result.get("results", []), str(result.get("last_seq", since)))
        wait = min(wait, self.server.settings.feed_timeout)
        params.update(feed="longpoll", timeout=int(wait * 1000))
        try:
            result = self.server.raw(
                "POST",
                path,
                params=params,
                body=body,
                client=self.server.feed_client,
                timeout=(self.server.settings.connect_timeout, wait + FEED_MARGIN),
                poll=True,
            )
        except StoreUnavailable:
            # The poll was cut by our read timeout (or the connection dropped): if the store
            # answers, there was simply no change; the caller asks again from the same `since`.
            if _answers(self.server):
                return ChangesBatch([], str(since), timed_out=True)
            raise
        # CouchDB ends a quiet poll itself at `timeout`: an empty batch, timed out as well.
        results = result.get("results", [])
        return ChangesBatch(results, str(result.get("last_seq", since)), timed_out=not results)

    def follow(
        self,
        since: str = "0",
        *,
        batch: int = 1000,
        include_docs: bool = True,
        wait: float | None = None,
    ) -> Iterator[ChangesBatch]:
        """Batches of changes from `since` onwards, forever (with `wait`) or until caught up."""
        while True:
            result = self.changes(since, limit=batch, include_docs=include_docs, wait=wait)
            since = result.last_seq
            if result.results or wait:
                yield result
            if not result.results and not wait:
                return

    # -- security and design documents ------------------------------------------------------
    def security(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._call(self.client.get_security))

    def set_security(self, security: Mapping[str, Any]) -> None:
        """Replace the database's `_security` (its admins: server admins and the database's
        own admins). Sent once, without the retries of a 5xx: COUCHDB_SECURITY_NO_MAJORITY."""
        body = {
            part: {
                "names": list(security.get(part, {}).get("names", [])),
                "roles": list(security.get(part, {}).get("roles", [])),
            }
            for part in ("admins", "members")
        }
        path = f"/{quote(self.name, safe='')}/_security"
        try:
            self.server.raw("PUT", path, body=body, client=self.server.single_shot_client)
        except StoreError as exc:
            if exc.status == 500 and exc.reason == "no_majority" and not self._administered_by_me():
                raise Forbidden(
                    403, "forbidden", f"only admins of {self.name} set its _security", exc.url
                ) from None
            raise

    def _administered_by_me(self) -> bool:
        """Whether this account is a server admin or an admin of this database."""
        try:
            ctx = self.server.session()
            if "_admin" in (ctx.get("roles") or []):
                return True
            admins = self.security().get("admins", {})
        except StoreError:
            return False
        roles = set(ctx.get("roles") or [])
        return ctx.get("name") in admins.get("names", []) or bool(
            roles & set(admins.get("roles", []))
        )

    def push_design(self, ddoc: Mapping[str, Any]) -> bool:
        """Write a design document unless the store already has the same one; True if written.

        The comparison is by content signature, so a push of unchanged files makes no new
        revision (a new revision would make every store re-check its view indexes).
        """
        body = _design_body(ddoc)
        signature = content_signature(body)
        name = ddoc["_id"].removeprefix("_design/")
        current = self.get(ddoc["_id"])
        if current and current.get("aso_signature") == signature:
            return False
        body["aso_signature"] = signature
        kwargs = {"rev": current["_rev"]} if current else {}
        self._call(self.client.put_design_document, ddoc=name, design_document=body, **kwargs)
        return True


def _answers(server: Server) -> bool:
    try:
        server.info()
        return True
    except StoreError:
        return False


def withdrawal(doc_id: str, rev: str) -> dict[str, Any]:
    """The deletion of one branch of a conflict (an agent may make it: `withdrawn`)."""
    return {"_id": doc_id, "_rev": rev, "_deleted": True, "withdrawn": WITHDRAWN}


def rev_order(rev: str) -> tuple[int, str]:
    """A revision's place in CouchDB's choice of a winner among live leaves: the longest
    revision path, then the greatest revision hash (docs: replication/conflicts.html)."""
    number, _, digest = rev.partition("-")
    try:
        return int(number), digest
    except ValueError:
        return 0, rev


def _doc_path(doc_id: str) -> str:
    if doc_id.startswith("_design/"):
        return "_design/" + quote(doc_id.removeprefix("_design/"), safe="")
    return quote(doc_id, safe="")


def content_signature(doc: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def design_signature(ddoc: Mapping[str, Any]) -> str:
    """The `aso_signature` `Database.push_design` stores with a design document: a stored one
    whose signature is that of the wanted one is up to date."""
    return content_signature(_design_body(ddoc))


def _design_body(ddoc: Mapping[str, Any]) -> dict[str, Any]:
    """A design document as it is signed and written: no revision, no signature."""
    return {k: v for k, v in ddoc.items() if k not in ("_rev", "aso_signature")}


def kind_of(welcome: Mapping[str, Any]) -> str:
    """COUCHDB or EMBEDDED, from the answer to `GET /`."""
    return EMBEDDED if "express-pouchdb" in welcome else COUCHDB


def redact(url: str) -> str:
    """A store URL fit for logs and messages (no credentials)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"
