"""ASO's configuration: one TOML file, every key declared here with its default and meaning.

The file is found at `--config PATH`, else `$ASO_CONFIG`, else `./aso.toml`, else
`~/.config/aso/aso.toml`, else `/etc/aso/aso.toml`; with none of them ASO runs on the defaults
below. Relative paths in the file are relative to the directory holding the file (to the current
directory when there is no file). A key this module does not declare is an error, never ignored:
a misspelt key would otherwise silently fall back to its default.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
import secrets
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from aso.limits import MAX_FEED_TIMEOUT, MAX_WRITTEN_DOC_CHARS, MIN_BLOCK_BYTES, PACED_DOC_BYTES

SEARCH_PATHS = (
    Path("aso.toml"),
    Path("~/.config/aso/aso.toml"),
    Path("/etc/aso/aso.toml"),
)


class ConfigError(Exception):
    """The configuration file cannot be used; the message says which key and why."""


def _key(default: Any, doc: str, *, secret: bool = False, path: bool = False) -> Any:
    meta = {"doc": doc, "secret": secret, "path": path, "default": default}
    if isinstance(default, dict | list):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class StoreConfig:
    url: str = _key(
        "http://127.0.0.1:5984",
        "CouchDB-3-API URL of the document store: the embedded pouchdb-server or a real CouchDB 3.",
    )
    engine: str = _key(
        "pouchdb",
        "The store `aso store start` and `aso run` run at a loopback store.url: `pouchdb` (the "
        "embedded pouchdb-server) or `couchdb` (Apache CouchDB 3 from `couchdb.home`).",
    )
    admin_user: str = _key("admin", "Server admin account (creates databases, design documents).")
    admin_password: str = _key(
        "", "Password of the server admin; `aso config init` generates one.", secret=True
    )
    user: str = _key("", "Account `aso` commands use for everyday work; empty: the admin account.")
    password: str = _key("", "Password of `store.user`.", secret=True)
    agent_user: str = _key(
        "aso-agent", "Account (role aso-agent) the agents use; `aso db init` creates it."
    )
    agent_password: str = _key(
        "", "Password of `store.agent_user`; `aso config init` generates one.", secret=True
    )
    auth: str = _key(
        "password",
        "How this process proves who it is: `password` (the accounts above, straight to the "
        "store) or `x509` (a certificate or proxy, through the front end at an https:// URL).",
    )
    x509_proxy: str = _key(
        "", "x509: proxy file; empty: $X509_USER_PROXY, then the next keys.", path=True
    )
    x509_cert: str = _key(
        "", "x509: certificate; empty: $X509_USER_CERT, /tmp/x509up_u<uid>, ~/.globus.", path=True
    )
    x509_key: str = _key("", "x509: key of `x509_cert`; empty: $X509_USER_KEY.", path=True)
    x509_cert_dir: str = _key(
        "",
        "x509: CA directory that verifies the front end; empty: $X509_CERT_DIR, "
        "then /etc/grid-security/certificates.",
        path=True,
    )
    files_db: str = _key("asynctransfer", "Database holding the transfer requests.")
    files_q: int = _key(
        8,
        "Shards (q) `aso db init` gives a new files database on a CouchDB cluster (more than "
        "one node; deploy/couchdb/cluster.ini says why); other databases get the cluster's q.",
    )
    transfers_db: str = _key(
        "aso_transfers", "Database of the gfal and sim transfer services' jobs."
    )
    catalog_db: str = _key("aso_catalog", "Database of the embedded catalog.")
    stats_db: str = _key(
        "aso_stats", "Database of the statistics and monitoring summaries analytics writes."
    )
    notify_db: str = _key(
        "aso_notify",
        "Database of users' notification subscriptions (`aso notify`) and of what the notifier "
        "told them; each user reads and writes only their own, through the front end.",
    )
    pages_db: str = _key(
        "aso_pages",
        "Database of the monitoring pages (one design document, written by `aso db init`): "
        "readable without logging in, so that its login page loads; it holds no data.",
    )
    connect_timeout: float = _key(5.0, "Seconds to wait for a TCP connection to the store.")
    read_timeout: float = _key(
        120.0, "Seconds to wait for a store answer (view builds can be slow)."
    )
    retries: int = _key(5, "Retries of a request that met a connection error, 429 or 5xx.")
    backoff: float = _key(0.5, "First retry delay in seconds; doubles at each retry.")
    backoff_max: float = _key(30.0, "Longest delay between two retries, in seconds.")
    pool_size: int = _key(16, "HTTP connections kept open to the store per process.")
    feed_timeout: float = _key(
        30.0,
        "Seconds a `_changes` long poll may wait for a change before the client ends it "
        "(at most 60: the front end's bound).",
    )


@dataclass
class EmbeddedConfig:
    enabled: bool = _key(
        True,
        "`aso run` starts the local store (store.engine) when nothing answers at a loopback "
        "store.url; false where the store is run elsewhere (one that is down is then an error, "
        "not replaced by an empty local store).",
    )
    data_dir: str = _key(
        "var/store",
        "Directory of the local store's data, pid files and logs (pouchdb-server: here; "
        "CouchDB: couchdb/ below it).",
        path=True,
    )
    server: str = _key(
        "",
        "pouchdb-server executable; empty: deploy/store/node_modules/.bin/pouchdb-server of the"
        " checkout, then pouchdb-server on PATH.",
        path=True,
    )
    start_timeout: float = _key(30.0, "Seconds `aso store start` waits for the store to answer.")
    compact_interval: float = _key(
        600.0,
        "Seconds between two compactions of the embedded store's databases by `aso run`, each "
        "one written to since its last (pouchdb-server keeps every revision's body until then; "
        "a local CouchDB compacts itself, deploy/couchdb/local.ini [smoosh]). 0: never.",
    )


@dataclass
class CouchDBConfig:
    home: str = _key(
        "",
        "Apache CouchDB 3 install that store.engine = couchdb runs (bin/couchdb, etc/default.ini);"
        " empty: $COUCHDB_HOME, then /opt/couchdb (Apache's packages).",
        path=True,
    )
    nodes: int = _key(
        1,
        "Nodes of a new local CouchDB: 1, or a cluster on loopback (node i on store.url's port"
        " + i - 1); `aso store start --nodes N` overrides it.",
    )
    log_level: str = _key(
        "warning", "CouchDB's log level (its `info` logs every request: gigabytes a day)."
    )
    js_engine: str = _key(
        "quickjs",
        "JavaScript engine of a local CouchDB's validation and views: quickjs (CouchDB 3.4+;"
        " about 3x the validated writes per second of spidermonkey here) or spidermonkey.",
    )


@dataclass
class LogConfig:
    level: str = _key(
        "INFO",
        "Log level: DEBUG, INFO, WARNING or ERROR (gfal2's protocol traces only with `-v`).",
    )


@dataclass
class TransferConfig:
    backend: str = _key("gfal", "Transfer service: gfal (embedded), fts3 (production) or sim.")
    max_files_per_job: int = _key(100, "Most files in one transfer job.")
    max_active_per_link: int = _key(100, "Most files in transfer per source→destination.")
    max_active_per_site: int = _key(
        200,
        "Most files in transfer from or to one site (unless the site sets its own).",
    )
    user_share: float = _key(
        0.75,
        "Most of a link's and a site's files in transfer one user may have, as a fraction of"
        " their caps (at least one file): the rest stays for the other users, whose files had"
        " waited behind one user's that could not start.",
    )
    overwrite: bool = _key(False, "Overwrite a file that exists at the destination.")
    verify_checksum: bool = _key(True, "Compare adler32 of source, destination and request.")
    priority: int = _key(3, "Job priority at the transfer service, 1 (lowest) to 5.")
    max_time_in_queue: int = _key(
        21600, "Seconds a job may wait at the transfer service before it gives up."
    )
    deadline: float = _key(
        2592000.0,
        "Seconds from a request's creation (or last resubmission) within which it is to be"
        " copied: past it, a file still waiting (queued, cooling off, held) fails with class"
        " expired. 0: none.",
    )
    status_interval: float = _key(
        2.0, "Seconds between two status polls of the transfer service while files are in it."
    )
    lease: float = _key(
        300.0,
        "Seconds a request's job may take to reach the transfer service after its submitter"
        " recorded it `submitted` (its lease): then the monitor puts a file whose job never got"
        " there back to `new`.",
    )


@dataclass
class SiteConfig:
    root_url: str = _key("", "XRootD endpoint of the site, e.g. root://127.0.0.1:21094.")
    http_url: str = _key("", "HTTP/WebDAV endpoint of the site, e.g. https://127.0.0.1:21095.")
    protocol: str = _key(
        "https",
        "Endpoint transfers use: root, http or https; sim for a simulated site (the sim back"
        " end's: no endpoint, no data).",
    )
    path_prefix: str = _key(
        "", "Prefix of the LFN in the endpoint's namespace (PFN = URL + prefix + LFN)."
    )
    temp_area: str = _key(
        "/store/temp/user/", "LFN area of jobs' temporary copies (the cleaner deletes only there)."
    )
    user_area: str = _key("/store/user/", "LFN area of users' final files.")
    embedded: bool = _key(True, "`aso storage start` runs an XRootD server for this site.")
    max_active: int = _key(
        0, "Most files in transfer from or to this site; 0: transfer.max_active_per_site."
    )


def _site(n: int) -> dict[str, Any]:
    # HTTPS: the embedded sites authenticate their clients by certificate (plain HTTP would be
    # anonymous). XRootD 5.5.3 has segfaulted in libssl under concurrent HTTPS third-party
    # copies here: `aso run` starts a site that died again (aso/local/xrootd.py, Keeper).
    return {
        "root_url": f"root://127.0.0.1:{21094 + 2 * n}",
        "http_url": f"https://127.0.0.1:{21095 + 2 * n}",
        "protocol": "https",
    }


DEFAULT_SITES = {"T2_CH_CERN": _site(0), "T2_IT_Pisa": _site(1), "T2_DE_DESY": _site(2)}


@dataclass
class StorageConfig:
    data_dir: str = _key(
        "var/storage",
        "Directory of the embedded XRootD servers: exports, configs, logs, TLS.",
        path=True,
    )
    xrootd: str = _key("/usr/bin/xrootd", "XRootD server executable.", path=True)
    start_timeout: float = _key(30.0, "Seconds `aso storage start` waits for each server.")
    hang_timeout: float = _key(
        60.0,
        "Seconds a running embedded site server may go without answering before `aso run`"
        " kills it and starts it again (0: never).",
    )


@dataclass
class GfalConfig:
    workers: int = _key(16, "Copies run at once by one gfal worker process.")
    per_site: int = _key(
        8,
        "Copies from or to one site that one gfal worker runs at once: a site that does not"
        " answer holds at most these of its slots.",
    )
    per_user: int = _key(
        6,
        "Copies of one user from or to one site that one gfal worker runs at once (at most"
        " gfal.per_site): the site's other slots stay for the other users, whose files had"
        " waited behind one user's long copies.",
    )
    stall_after: float = _key(
        30.0,
        "Seconds a copy may run before the worker asks its two sites whether they answer; one"
        " that does not (within 5 s) is held for every user until it answers again, and the"
        " copies hung on it count against it alone, not against the worker's slots nor the good"
        " site at their other end.",
    )
    timeout: int = _key(3600, "Seconds one copy may take.")
    operation_timeout: int = _key(
        120,
        "Seconds one HTTP request to a storage may stay unanswered (a look, a deletion, a step"
        " of a copy; a third-party copy's progress markers keep it going): a storage that takes"
        " connections and answers none costs a copy a few of these.",
    )
    poll_interval: float = _key(2.0, "Seconds between two looks for new jobs.")
    retries: int = _key(
        2, "Copies retried in place after a connection failure or timeout (a storage restarting)."
    )
    retry_delay: float = _key(10.0, "Seconds before such a retry.")
    x509_cert: str = _key(
        "certs/aso-agent-host-cert.pem",
        "Certificate the agents' gfal2 clients present to the sites (a service certificate "
        "whose DN the grid-mapfile maps with role aso-agent); empty: $X509_USER_CERT or a proxy.",
        path=True,
    )
    x509_key: str = _key("certs/aso-agent-host-key.pem", "Key of `x509_cert`.", path=True)


@dataclass
class Fts3Config:
    endpoint: str = _key("", "FTS3 REST endpoint, e.g. https://fts3.example.org:8446.")
    proxy: str = _key(
        "", "X.509 proxy to authenticate and delegate; empty: $X509_USER_PROXY.", path=True
    )
    capath: str = _key(
        "/etc/grid-security/certificates", "CA directory to verify the FTS3 server.", path=True
    )
    verify: bool = _key(True, "Verify the FTS3 server's certificate.")
    timeout: float = _key(60.0, "Seconds to wait for an FTS3 answer.")
    retry: int = _key(0, "Retries FTS3 itself makes of a failed file (ASO retries on its own).")
    monitor_url: str = _key(
        "", "Link template to a job in the FTS web monitor; {job_id} is replaced."
    )


@dataclass
class SimConfig:
    mean_duration: float = _key(20.0, "Mean simulated transfer time in seconds.")
    distribution: str = _key(
        "exponential", "Duration distribution: exponential, lognormal or fixed."
    )
    failure_rate: float = _key(0.0, "Probability that a simulated transfer fails.")
    link_failure_rates: dict[str, float] = _key(
        {}, 'Failure probability per link, {"SRC>DST" = 0.5}, over failure_rate.'
    )
    failure_classes: dict[str, float] = _key(
        {"connection": 0.5, "timeout": 0.3, "source_missing": 0.1, "checksum_mismatch": 0.1},
        "Weights of the error classes of simulated failures.",
    )
    outages: list[dict[str, Any]] = _key(
        [],
        'Outages of a site or a link ("SRC>DST", wildcards): '
        '[{site = "T2_X", start = 0, end = 600}], seconds after the service starts.',
    )
    seed: int = _key(0, "Seed of the random draws (same seed, same durations and failures).")
    timeout: float = _key(
        3600.0, "Seconds a simulated transfer may take; a longer one fails (class timeout)."
    )


@dataclass
class RetryConfig:
    policy: str = _key(
        "default",
        "Retry policy, by name from the entry points `aso.retry_policies`: default or adaptive.",
    )
    max_attempts: int = _key(5, "Attempts of a file (since its last resubmission) before it fails.")
    base_delay: float = _key(
        60.0, "Cool-off in seconds after the first failed attempt; doubles after each."
    )
    max_delay: float = _key(3600.0, "Longest cool-off in seconds.")
    jitter: float = _key(
        0.2, "Cool-offs vary by this fraction either way (spreads retries of a batch)."
    )
    checksum_retries: int = _key(1, "Checksum mismatches retried before the file fails.")
    window: float = _key(3600.0, "adaptive: seconds of a link's recent outcomes that count.")
    min_samples: int = _key(10, "adaptive: outcomes a link needs before it can be judged bad.")
    bad_link_ratio: float = _key(0.5, "adaptive: failure ratio above which a link is bad.")
    link_penalty: float = _key(4.0, "adaptive: factor on the cool-off of a file on a bad link.")


@dataclass
class HoldsConfig:
    enabled: bool = _key(
        True,
        "A user's files for a destination that refused them for room (quota) or permission wait"
        " held, keeping their attempts, until the destination passes a check; false: such a"
        " failure fails the file at once.",
    )
    deadline: float = _key(
        604800.0, "Seconds a file may wait held (from its first such failure) before it fails."
    )
    first_check: float = _key(
        60.0,
        "Seconds from a hold's start to the first check of its destination; doubles after each.",
    )
    max_check_interval: float = _key(
        3600.0, "Longest wait in seconds between two checks of a hold."
    )
    interval: float = _key(10.0, "Seconds between two looks of the hold checker at the holds due.")
    look_timeout: float = _key(
        30.0, "Seconds a look at a held destination may take; one longer did not pass."
    )
    admission: bool = _key(
        True,
        "Before it sends a user's files to a destination, the submitter compares their bytes"
        " with the room the destination reports for the user's area (less what is on its way"
        " there); what cannot fit waits held, with the figures, instead of failing there.",
    )
    space_refresh: float = _key(
        300.0,
        "Seconds the submitter keeps a destination's reported free space before asking again.",
    )
    breaker_failures: int = _key(
        10,
        "Attempts to one destination failing without an answer (connection, timeout), none"
        " succeeding since, that hold every user's files for it (a site's hold).",
    )
    breaker_users: int = _key(2, "Users those attempts must be of, at least.")
    breaker_window: float = _key(300.0, "Seconds within which those attempts failed.")


@dataclass
class CleanerConfig:
    max_per_site: int = _key(
        8,
        "Deletions at once at one site, in each process that deletes (cleaner, publisher, "
        "monitor).",
    )
    batch: int = _key(200, "Files a cleaner handles in one cycle.")
    at_done_wait: float = _key(
        5.0,
        "Seconds the monitor waits for the deletions of the temporary copies of files it records "
        "done that need no publication, to record each in the same write; the rest are the "
        "cleaner's. 0: the cleaner deletes them all.",
    )
    base_delay: float = _key(
        60.0, "Seconds before a failed deletion is tried again; doubles each time."
    )
    max_delay: float = _key(3600.0, "Longest wait between two tries of a deletion.")
    failed_grace: float = _key(
        259200.0,
        "Seconds after a file failed for good (or was killed) that its temporary copy is"
        " deleted; until then its owner may resubmit it. Once deleted, only a job retry's new"
        " file renews the request.",
    )
    discard_interval: float = _key(
        600.0, "Seconds between two looks of the cleaner for failed files past their grace."
    )


@dataclass
class PublisherConfig:
    catalog: str = _key("embedded", "Catalog: embedded (a database in the store) or dbs (DBS3).")
    max_files_per_block: int = _key(100, "Files in a block; a full block is published at once.")
    max_block_bytes: int = _key(
        2_000_000,
        "Largest block, as JSON; a block this large is full, as at max_files_per_block (kept "
        "below the store's document size limit).",
    )
    blocks_per_call: int = _key(
        100, "Blocks of a cycle handed to the catalog at once (embedded: 4 requests; DBS: 1 each)."
    )
    block_closure_timeout: float = _key(
        3600.0, "Seconds a block waits for more files after its oldest file was copied."
    )
    max_attempts: int = _key(5, "Failed publications of a file before it is publication_failed.")
    base_delay: float = _key(60.0, "Seconds before a failed publication is tried again; doubles.")
    max_delay: float = _key(3600.0, "Longest wait between two tries of a publication.")


@dataclass
class DbsConfig:
    url: str = _key("", "DBS3 writer URL, e.g. https://cmsweb.cern.ch/dbs/prod/phys03/DBSWriter.")
    reader_url: str = _key(
        "", "DBS3 reader URL; empty: the writer URL with DBSWriter replaced by DBSReader."
    )
    proxy: str = _key("", "X.509 proxy for DBS; empty: $X509_USER_PROXY.", path=True)
    capath: str = _key("/etc/grid-security/certificates", "CA directory to verify DBS.", path=True)
    acquisition_era: str = _key("CRAB", "Acquisition era of published datasets.")
    processing_version: int = _key(1, "Processing version of published datasets.")
    global_tag: str = _key("None", "Global tag recorded in the dataset configuration.")
    release_version: str = _key("CMSSW_X", "Release recorded in the dataset configuration.")
    timeout: float = _key(300.0, "Seconds one DBS call may take (the client sets none itself).")


@dataclass
class AnalyticsConfig:
    interval: float = _key(600.0, "Seconds between two aggregations of finished requests.")
    purge_after: float = _key(
        604800.0, "Seconds after its last change a finished request is purged (0: never)."
    )
    batch: int = _key(1000, "Requests aggregated (and purged) in one bulk write.")
    summary_interval: float = _key(
        30.0, "Seconds between two updates of the monitoring summaries (the pages' 'now')."
    )
    close_after: float = _key(
        300.0,
        "Seconds after its end an hour is summed up for good (clock skew and slow writes).",
    )


@dataclass
class NotifyConfig:
    urls: list[str] = _key(
        [],
        "Where the notifier tells operators of holds (started, released, cancelled, expired):"
        " apprise URLs (mailto://, json:// for a webhook, mmost:// for Mattermost, ...; they"
        " may hold passwords). Empty: nobody is told.",
        secret=True,
    )
    user_mail: str = _key(
        "",
        "The apprise mailto:// URL (the operator's SMTP server and sender) through which users'"
        " subscribed addresses are mailed; its `to` is each address. Empty: users get no mail.",
        secret=True,
    )
    mail_domains: list[str] = _key(
        [],
        "Mail domains users may subscribe addresses of (a domain and its subdomains). Empty:"
        " no user mail.",
    )
    webhooks: list[str] = _key(
        [],
        "http(s) addresses under which users may subscribe webhooks (JSON or Mattermost), e.g."
        " https://mattermost.example.org/hooks/. Empty: no user webhook is ever contacted.",
    )
    interval: float = _key(30.0, "Seconds between two looks of the notifier at the holds.")
    min_interval: float = _key(
        300.0,
        "Seconds between two notices about one hold: its events meanwhile are told together.",
    )
    max_age: float = _key(
        3600.0, "Seconds after which an event not told yet is passed over (no storm of old news)."
    )


@dataclass
class ReconcilerConfig:
    interval: float = _key(3600.0, "Seconds between two reconciliations by the reconciler agent.")
    stuck_after: float = _key(
        86400.0, "Seconds in one non-final state after which a request counts as stuck."
    )
    orphan_grace: float = _key(
        3600.0, "Seconds a temporary file may exist without its request before it is reported."
    )


@dataclass
class AgentsConfig:
    poll_interval: float = _key(5.0, "Seconds an agent waits for new work when it has none.")
    feed_relay: bool = _key(
        True,
        "`aso run` reads the files database's changes once for all its agents and relays them"
        " on loopback (aso/feedrelay.py), instead of each agent reading every change itself.",
    )
    feed_relay_changes: int = _key(
        20000, "Changes the feed relay keeps in memory for agents that read behind."
    )
    feed_relay_bytes: int = _key(
        256 << 20,
        "Most the changes the feed relay keeps weigh, as JSON text: fewer changes are kept when"
        " requests are large (an agent further behind starts again from the queue view).",
    )
    feed_interval: float = _key(
        1.0,
        "Least seconds between two reads of the changes feed by one agent instance: under load"
        " each read gathers a second's changes instead of one (0: read again at once).",
    )
    heartbeat_interval: float = _key(15.0, "Seconds between two heartbeats of an agent instance.")
    heartbeat_expiry: float = _key(
        60.0, "Seconds after its last heartbeat an instance counts as dead; others take its work."
    )
    set_aside_after: int = _key(
        3,
        "Errors of an agent's own on one request, in a row, after which it sets the request"
        " aside (class unprocessable, with the reason) instead of trying again next cycle.",
    )
    hang_timeout: float = _key(
        1800.0,
        "Seconds one turn of an agent's loop may last without progress (a long turn that"
        " makes progress, such as the reconciler checking many files, starts the count again);"
        " past it the agent writes every thread's stack into its log and exits (code 1) for"
        " `aso run` or systemd to start it again. 0: never.",
    )
    instances: dict[str, int] = _key(
        {
            "submitter": 1,
            "monitor": 1,
            "retry-manager": 1,
            "cleaner": 1,
            "publisher": 1,
            "analytics": 1,
            "reconciler": 1,
            "hold-checker": 1,
            "notifier": 1,
        },
        "How many instances of each agent `aso run` starts (an agent the file does not name:"
        " its default here; 0: none).",
    )
    log_dir: str = _key("var/log", "Directory of the agents' log files under `aso run`.", path=True)


@dataclass
class FrontendConfig:
    enabled: bool = _key(False, "`aso run` starts the front end too (`aso config init`: true).")
    listen: str = _key("127.0.0.1:8443", "host:port the X.509 front end (`aso frontend`) serves.")
    host_cert: str = _key("certs/hostcert.pem", "The front end's certificate (PEM).", path=True)
    host_key: str = _key("certs/hostkey.pem", "The front end's private key (PEM).", path=True)
    capath: str = _key(
        "certs/certificates",
        "Grid CA directory: trusted CAs `<hash>.0` and their CRLs `<hash>.r0`.",
        path=True,
    )
    require_crl: bool = _key(True, "Refuse certificates whose CA has no valid CRL in `capath`.")
    mapfile: str = _key(
        "certs/grid-mapfile",
        'Identity mapping, one line per DN: "DN" user [role,...] (default role aso-user).',
        path=True,
    )
    auth: str = _key(
        "session",
        "How the store learns who it is: `proxy` (CouchDB proxy authentication with "
        "`proxy_secret`) or `session` (per-user store accounts only the front end knows).",
    )
    secret: str = _key(
        "",
        "Front-end secret: the CouchDB proxy-auth secret, or the key of the per-user passwords.",
        secret=True,
    )
    proxy_hash: str = _key(
        "sha256", "HMAC hash of CouchDB proxy-auth tokens (the store's `chttpd_auth` setting)."
    )
    max_body: int = _key(67108864, "Largest request body forwarded, in bytes (larger: 413).")
    request_timeout: float = _key(
        60.0, "Seconds a client has to send a request whole, from its first line (later: 408)."
    )
    idle_timeout: float = _key(
        60.0, "Seconds a client connection may stay silent between requests before it is closed."
    )
    polls_per_user: int = _key(
        4,
        "Long polls of one user held at the store at once; more wait their turn, within their "
        "own timeout (a poll that waited it all ends with no change, as a quiet one does).",
    )
    polls: int = _key(
        64, "Long polls of all users held at the store at once (agents' not counted)."
    )
    user_docs_per_second: int = _key(
        100,
        "Documents one user writes per second on average (a bulk write of up to 1000 goes at "
        "once, then the user's next writes wait their turn in the front end), a write counting "
        f"one document per {PACED_DOC_BYTES // 1024} KiB of its body at least: the store "
        "validates, indexes and keeps each one (agents' and operators' writes are not paced).",
    )
    connections: int = _key(
        8192,
        "Client connections open at once; past it a new one is closed at once, before its TLS "
        "handshake (keep it under the process's open-file limit).",
    )
    connections_per_address: int = _key(
        512,
        "Client connections open at once from one IP address (one client cannot take them "
        "all); raise it for a site whose jobs reach ASO through one NAT address.",
    )
    unidentified_connections: int = _key(
        1024,
        "Connections whose client has not yet shown a certificate chain that verifies, in all; "
        "past it a newcomer takes the oldest of the address holding the most, if that address "
        "holds more than the newcomer's would, and is closed otherwise.",
    )
    unidentified_per_address: int = _key(
        32, "Connections not yet identified from one address (an IPv6 /64); more are closed."
    )
    identify_timeout: float = _key(
        10.0,
        "Seconds a new connection has to finish its TLS handshake with a certificate chain "
        "that verifies (later: closed).",
    )
    body_bytes: int = _key(
        1073741824,
        "Request body bytes held at once (arriving, checked or forwarded; spooled to TMPDIR "
        "past 100 kB), all clients; a body that would pass it gets 503 with Retry-After.",
    )
    body_bytes_per_user: int = _key(
        134217728,
        "Request body bytes held at once for one user (a client whose certificate is still "
        "being checked: its address); a body that would pass it gets 503 with Retry-After.",
    )
    body_processes: int = _key(
        2,
        "Worker processes that check request bodies of 64 KiB and more (parsing JSON holds "
        "the front end's interpreter: one user's large bodies had slowed every client); 0: "
        "checked in the front end's own threads.",
    )
    connections_per_user: int = _key(
        512,
        "Connections one user (a certificate's DN) holds at once; the next one's requests get "
        "503 (raise it for a service that reaches ASO with one certificate).",
    )
    demo_certs: str = _key(
        "certs",
        "`aso certs demo` directory whose users' certificates `aso demo` goes through the front "
        "end with (a fresh proxy each run).",
        path=True,
    )


METRICS_PORT_SPAN = 100  # ports an agent tries from metrics.port upward


@dataclass
class MetricsConfig:
    host: str = _key(
        "127.0.0.1",
        "Address the Prometheus metrics are served on (0.0.0.0: every interface, for a "
        "Prometheus on another host).",
    )
    port: int = _key(
        9400,
        "First metrics port of the agents: each agent process takes the first free port from "
        "here upward and records it in its heartbeat (`aso metrics targets`); 0: no metrics.",
    )
    frontend_port: int = _key(9399, "Metrics port of the front end; 0: no metrics.")


@dataclass
class Config:
    store: StoreConfig = field(default_factory=StoreConfig)
    embedded: EmbeddedConfig = field(default_factory=EmbeddedConfig)
    couchdb: CouchDBConfig = field(default_factory=CouchDBConfig)
    log: LogConfig = field(default_factory=LogConfig)
    transfer: TransferConfig = field(default_factory=TransferConfig)
    sites: dict[str, SiteConfig] = field(
        default_factory=lambda: {name: SiteConfig(**v) for name, v in DEFAULT_SITES.items()},
        metadata={"table_of": SiteConfig},
    )
    storage: StorageConfig = field(default_factory=StorageConfig)
    gfal: GfalConfig = field(default_factory=GfalConfig)
    fts3: Fts3Config = field(default_factory=Fts3Config)
    sim: SimConfig = field(default_factory=SimConfig)
    retry: RetryConfig = field(default_factory=RetryConfig)
    holds: HoldsConfig = field(default_factory=HoldsConfig)
    cleaner: CleanerConfig = field(default_factory=CleanerConfig)
    publisher: PublisherConfig = field(default_factory=PublisherConfig)
    dbs: DbsConfig = field(default_factory=DbsConfig)
    analytics: AnalyticsConfig = field(default_factory=AnalyticsConfig)
    reconciler: ReconcilerConfig = field(default_factory=ReconcilerConfig)
    notify: NotifyConfig = field(default_factory=NotifyConfig)
    agents: AgentsConfig = field(default_factory=AgentsConfig)
    frontend: FrontendConfig = field(default_factory=FrontendConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    source: Path | None = field(default=None, metadata={"internal": True})

    @property
    def base_dir(self) -> Path:
        """Directory that relative paths in the file are relative to."""
        return self.source.parent if self.source else Path.cwd()

    def path(self, value: str) -> Path:
        return (self.base_dir / Path(value).expanduser()).resolve()

    @property
    def store_user(self) -> tuple[str, str]:
        """Credentials of the everyday `aso` commands."""
        if self.store.user:
            return self.store.user, self.store.password
        return self.store.admin_user, self.store.admin_password


def sections(config: Config | None = None) -> list[tuple[str, Any]]:
    """(name, section) for every section in file order; a section is a dataclass instance, or
    a {name: dataclass} table for `sites`."""
    target = config or Config()
    return [
        (f.name, getattr(target, f.name))
        for f in dataclasses.fields(Config)
        if not f.metadata.get("internal")
    ]


def _table_of(name: str) -> type | None:
    return next(f.metadata.get("table_of") for f in dataclasses.fields(Config) if f.name == name)


def describe() -> list[tuple[str, Any, str]]:
    """(`section.key`, default, meaning) for every key: docs/configuration.md's table."""
    rows = []
    for name, section in sections():
        kind = _table_of(name)
        prefix = f"{name}.NAME" if kind else name
        for f in dataclasses.fields(kind or section):
            rows.append((f"{prefix}.{f.name}", f.metadata["default"], f.metadata["doc"]))
    return rows


def _check_type(where: str, value: Any, expected: type) -> Any:
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise ConfigError(
            f"{where}: expected {expected.__name__}, got {type(value).__name__} {value!r}"
        )
    return value


def _unknown(where: str, name: str, known: list[str]) -> ConfigError:
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return ConfigError(f"{where}: unknown key '{name}'{hint}")


def _fill(section: Any, values: dict[str, Any], label: str, prefix: str) -> None:
    fields = {f.name: f for f in dataclasses.fields(section)}
    for key, value in values.items():
        if key not in fields:
            raise _unknown(label, f"{prefix}.{key}", [f"{prefix}.{k}" for k in fields])
        expected = type(fields[key].metadata["default"])
        setattr(section, key, _check_type(f"{label}: {prefix}.{key}", value, expected))


def from_dict(data: dict[str, Any], source: Path | None = None) -> Config:
    config = Config(source=source)
    label = str(source) if source else "config"
    known_sections = [name for name, _ in sections(config)]
    for section_name, values in data.items():
        if section_name not in known_sections:
            raise _unknown(label, section_name, known_sections)
        if not isinstance(values, dict):
            raise ConfigError(f"{label}: [{section_name}] must be a table")
        kind = _table_of(section_name)
        if kind is None:
            _fill(getattr(config, section_name), values, label, section_name)
            continue
        # A table of named entries (the site catalogue): the file's entries replace the defaults.
        table = {}
        for entry, entry_values in values.items():
            if not isinstance(entry_values, dict):
                raise ConfigError(f"{label}: [{section_name}.{entry}] must be a table")
            table[entry] = kind()
            _fill(table[entry], entry_values, label, f"{section_name}.{entry}")
        setattr(config, section_name, table)
    # The agents a file's [agents.instances] does not name run their default count: a config
    # written before an agent existed would never start it (round 29: no hold checker ran).
    config.agents.instances = {**AgentsConfig().instances, **config.agents.instances}
    _check_values(config, label)
    return config


# The keys that take one of a few words (one source: the CLI's options take the same tuples).
ENGINES = ("pouchdb", "couchdb")
DISTRIBUTIONS = ("exponential", "lognormal", "fixed")
CHOICES: dict[str, tuple[str, ...]] = {
    "store.engine": ENGINES,
    "store.auth": ("password", "x509"),
    "couchdb.log_level": ("debug", "info", "notice", "warning", "error"),
    "couchdb.js_engine": ("quickjs", "spidermonkey"),
    "frontend.auth": ("proxy", "session"),
    "frontend.proxy_hash": ("sha1", "sha256", "sha512"),
    "transfer.backend": ("gfal", "fts3", "sim"),
    "sim.distribution": DISTRIBUTIONS,
    "publisher.catalog": ("embedded", "dbs"),
}
# The whole numbers with bounds, inclusive.
RANGES: dict[str, tuple[float, float]] = {
    "store.files_q": (1, 64),
    "transfer.user_share": (0.01, 1.0),
    "couchdb.nodes": (1, 9),
    "transfer.max_files_per_job": (1, 1000),
    "gfal.per_site": (1, 100_000),
    "gfal.per_user": (1, 100_000),
    "transfer.priority": (1, 5),
    "publisher.blocks_per_call": (1, 1000),
    "publisher.max_block_bytes": (MIN_BLOCK_BYTES, MAX_WRITTEN_DOC_CHARS // 2),
    "frontend.polls_per_user": (1, 1000),
    "frontend.user_docs_per_second": (1, 1_000_000),
    "frontend.polls": (1, 10000),
    "frontend.connections": (1, 1_000_000),
    "frontend.connections_per_address": (1, 1_000_000),
    "frontend.unidentified_connections": (1, 1_000_000),
    "frontend.unidentified_per_address": (1, 1_000_000),
    "frontend.body_bytes": (1, 1 << 40),
    "frontend.body_bytes_per_user": (1, 1 << 40),
    "frontend.connections_per_user": (1, 1_000_000),
    "frontend.body_processes": (0, 64),
}
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
SITE_PROTOCOLS = ("root", "http", "https", "sim")


def one_of(words: Sequence[str]) -> str:
    """The words as a sentence says them: "a, b or c"."""
    return f"{', '.join(words[:-1])} or {words[-1]}" if len(words) > 1 else words[0]


def _at(config: Config, key: str) -> Any:
    section, _, name = key.partition(".")
    return getattr(getattr(config, section), name)


def _check_notify(notify: NotifyConfig, bad: Callable[[str], Exception]) -> None:
    """Users' notices go only where the operator's settings say: each allowed webhook address
    is one, the users' mail goes through a mailto URL."""
    from aso import model

    for url in notify.webhooks:
        if model.target_problem("webhook", url):
            raise bad(f"notify.webhooks: {url[:100]!r} is not an http(s) address of "
                      f"{model.WEBHOOK_PATTERN}")  # fmt: skip
    if notify.user_mail and not notify.user_mail.startswith(("mailto://", "mailtos://")):
        raise bad("notify.user_mail must be an apprise mailto:// or mailtos:// URL")
    for domain in notify.mail_domains:
        if model.target_problem("mail", f"x@{domain.lstrip('.')}"):
            raise bad(f"notify.mail_domains: {domain[:100]!r} is not a mail domain")


def _check_values(config: Config, label: str) -> None:
    def bad(message: str) -> ConfigError:
        return ConfigError(f"{label}: {message}")

    _check_store_and_front_end(config, bad)
    for key, words in CHOICES.items():
        if _at(config, key) not in words:
            raise bad(f"{key} must be {one_of(words)}")
    for key, (low, high) in RANGES.items():
        if not low <= _at(config, key) <= high:
            raise bad(f"{key} must be between {low} and {high}")
    if config.log.level.upper() not in LOG_LEVELS:
        raise bad(f"log.level must be {one_of(LOG_LEVELS)}")
    for name, site in config.sites.items():
        if site.protocol not in SITE_PROTOCOLS:
            raise bad(f"sites.{name}.protocol must be {one_of(SITE_PROTOCOLS)}")
        if site.protocol == "sim":
            continue  # a simulated site has no endpoint
        url = site.root_url if site.protocol == "root" else site.http_url
        if not url:
            raise bad(f"sites.{name} uses protocol {site.protocol} but has no URL for it")
        if site.embedded and site.protocol == "http":
            raise bad(
                f"sites.{name}: an embedded site refuses plain http:// (no client certificate: "
                'anonymous, which may not read, write or delete); use protocol = "https"'
            )
    rates = [config.sim.failure_rate, *config.sim.link_failure_rates.values()]
    if any(not isinstance(r, int | float) or not 0 <= r <= 1 for r in rates):
        raise bad("sim failure rates must be numbers between 0 and 1")
    if config.publisher.catalog == "dbs" and not config.dbs.url:
        raise bad("publisher.catalog is dbs but dbs.url is empty")
    if not 0 <= config.retry.jitter < 1 or config.retry.max_attempts < 1:
        raise bad("retry.jitter must be in [0, 1) and retry.max_attempts >= 1")
    holds = config.holds
    notify = config.notify
    timings = (holds.deadline, holds.first_check, holds.max_check_interval, holds.interval,
               holds.look_timeout, holds.breaker_window, holds.space_refresh,
               notify.interval, notify.max_age, notify.min_interval)  # fmt: skip
    if min(timings) <= 0 or min(holds.breaker_failures, holds.breaker_users) < 1:
        raise bad("holds' seconds must be above 0 and holds.breaker_failures, _users at least 1")
    _check_notify(config.notify, bad)
    if config.embedded.compact_interval < 0:
        raise bad("embedded.compact_interval must be 0 (never) or more seconds")
    if config.storage.hang_timeout < 0:
        raise bad("storage.hang_timeout must be 0 (never) or more seconds")
    for agent, count in config.agents.instances.items():
        if not isinstance(count, int) or count < 0:
            raise bad(f"agents.instances.{agent} must be a whole number >= 0")


def _check_store_and_front_end(config: Config, bad: Callable[[str], ConfigError]) -> None:
    if not config.store.url.startswith(("http://", "https://")):
        raise bad("store.url must be an http:// or https:// URL")
    for name in ("retries", "pool_size"):
        if getattr(config.store, name) < (0 if name == "retries" else 1):
            raise bad(f"store.{name} is out of range")
    if not 0 < config.store.feed_timeout <= MAX_FEED_TIMEOUT:
        raise bad(f"store.feed_timeout must be above 0 and at most {MAX_FEED_TIMEOUT:g} seconds")
    if config.agents.feed_relay_changes < 100:
        raise bad("agents.feed_relay_changes must be at least 100")
    if config.agents.feed_relay_bytes < 1 << 20:
        raise bad("agents.feed_relay_bytes must be at least 1 MiB (1048576)")
    if config.agents.feed_interval < 0:
        raise bad("agents.feed_interval must be 0 or more seconds")
    if config.store.auth == "x509" and not config.store.url.startswith("https://"):
        raise bad("store.auth = x509 needs an https:// store.url (the front end)")
    fe = config.frontend
    if not fe.body_bytes >= fe.body_bytes_per_user >= fe.max_body:
        raise bad("frontend.body_bytes >= frontend.body_bytes_per_user >= frontend.max_body "
                  "must hold (a body the front end takes must fit)")  # fmt: skip
    for key in ("request_timeout", "idle_timeout", "identify_timeout"):
        if not getattr(config.frontend, key) > 0:
            raise bad(f"frontend.{key} must be above 0 seconds")
    host, _, port = config.frontend.listen.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise bad("frontend.listen must be host:port")
    for name, span in (("port", METRICS_PORT_SPAN), ("frontend_port", 1)):
        if not 0 <= getattr(config.metrics, name) <= 65536 - span:
            raise bad(f"metrics.{name} must be a port number (0: no metrics)")


def find_config_file(explicit: str | None = None) -> Path | None:
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        return path.resolve()
    env = os.environ.get("ASO_CONFIG")
    if env:
        return find_config_file(env)
    for candidate in SEARCH_PATHS:
        path = candidate.expanduser()
        if path.is_file():
            return path.resolve()
    return None


def load(explicit: str | None = None) -> Config:
    path = find_config_file(explicit)
    if path is None:
        return Config()
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    return from_dict(data, source=path)


def _section_dict(section: Any, show_secrets: bool) -> dict[str, Any]:
    values = {}
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if f.metadata["secret"] and value and not show_secrets:
            value = "********"
        values[f.name] = value
    return values


def to_dict(config: Config, *, show_secrets: bool = False) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, section in sections(config):
        if _table_of(name):
            out[name] = {k: _section_dict(v, show_secrets) for k, v in section.items()}
        else:
            out[name] = _section_dict(section, show_secrets)
    return out


def markdown_table() -> str:
    """docs/configuration.md's table of keys (`aso config keys --markdown`)."""
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for key, default, doc in describe():
        shown = f'`"{default}"`' if isinstance(default, str) else f"`{default}`"
        lines.append(f"| `{key}` | {shown} | {doc} |")
    return "\n".join(lines)


def render(config: Config, *, show_secrets: bool = False) -> str:
    return tomli_w.dumps(to_dict(config, show_secrets=show_secrets))


def new_config_text() -> str:
    """A fresh config file: the defaults, with generated passwords for the store accounts."""
    config = Config()
    config.store.admin_password = secrets.token_urlsafe(18)
    config.store.agent_password = secrets.token_urlsafe(18)
    config.frontend.secret = secrets.token_urlsafe(24)
    config.frontend.enabled = True  # with the throw-away PKI `aso config init` writes
    header = (
        "# ASO configuration, written by `aso config init`. Every key and its default is listed\n"
        "# in docs/configuration.md; `aso config show` prints the effective values.\n"
    )
    return header + render(config, show_secrets=True)


def write_new_config(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # The file holds passwords: create it readable by its owner only.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(new_config_text())
