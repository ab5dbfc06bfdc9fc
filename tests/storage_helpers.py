"""Real embedded storage for tests: sites on free loopback ports in a directory the servers'
account can enter (pytest's own tmp directories are mode 0700, which the `xrootd` user that
root-started servers run as cannot enter)."""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aso.config import Config, SiteConfig
from aso.local import pki
from aso.local.stores import distinct_free_ports
from aso.local.xrootd import EmbeddedStorage, Keeper, export_path, run_as


@contextmanager
def reachable_tmp_dir(prefix: str = "aso-storage-test-") -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix=prefix))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


# The users of the storage tests' grid PKI (`al`: a name that is the start of another's).
PKI_USERS = ["alice", "bob", "al"]


@functools.cache
def shared_pki() -> Path:
    """One throw-away grid PKI (`aso certs demo`'s) for every storage of this test process, in
    a directory the servers' account can enter: the XRootD client reads its XrdSecgsi settings
    (CA directory, certificate files) once per process, so every site a process talks to must
    be of the same PKI, and these files must outlive every test."""
    base = Path(tempfile.mkdtemp(prefix="aso-test-pki-"))
    base.chmod(0o755)
    atexit.register(shutil.rmtree, base, ignore_errors=True)
    pki.demo(base, PKI_USERS)
    return base


def storage_config(
    base: Path, site_names: list[str], protocol: str = "https", certs: Path | None = None
) -> Config:
    """A config whose catalogue is `site_names`, each embedded on two free loopback ports, with
    a grid PKI (`certs`, `aso certs demo`'s files; by default the test PKI): the sites' CAs,
    host certificate and grid-mapfile, the agents' certificate."""
    config = Config(source=base / "aso.toml")
    config.storage.data_dir = str(base / "storage")
    config.storage.start_timeout = 20.0
    certs = certs or shared_pki()
    config.frontend.capath = str(certs / "certificates")
    config.frontend.host_cert = str(certs / "hostcert.pem")
    config.frontend.host_key = str(certs / "hostkey.pem")
    config.frontend.mapfile = str(certs / "grid-mapfile")
    config.gfal.x509_cert = str(certs / "aso-agent-host-cert.pem")
    config.gfal.x509_key = str(certs / "aso-agent-host-key.pem")
    # Distinct ports: one free_port() after another once gave two sites the same port.
    ports = iter(distinct_free_ports(2 * len(site_names)))
    config.sites = {
        name: SiteConfig(
            root_url=f"root://127.0.0.1:{next(ports)}",
            http_url=f"https://127.0.0.1:{next(ports)}",
            protocol=protocol,
        )
        for name in site_names
    }
    return config


@contextmanager
def running_storage(config: Config) -> Iterator[EmbeddedStorage]:
    storage = EmbeddedStorage(config)
    storage.start()
    try:
        yield storage
    finally:
        storage.stop()


@contextmanager
def small_area(config: Config, site: str, lfn_dir: str, size: int) -> Iterator[Path]:
    """`lfn_dir` at an embedded `site` on a file system of `size` bytes (a tmpfs the servers'
    account owns): a destination that fills up, as a user's quota does (`tmpfs`)."""
    path = export_path(config, site, lfn_dir)
    owner = run_as()
    missing = [p for p in [path, *path.parents] if not p.exists()]
    for directory in reversed(missing):  # the servers' own, as they would have made them
        directory.mkdir()
        os.chown(directory, owner.uid, owner.gid)
    with tmpfs(path, f"size={size},uid={owner.uid},gid={owner.gid},mode=0755"):
        yield path


@contextmanager
def tmpfs(path: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at `path` with `options` for the test, unmounted afterwards. Needs the
    right to mount (root, as `make test` runs here); where it is missing the test is skipped."""
    import pytest

    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


class Watchdog(threading.Thread):
    """Starts again a site server that died or stopped answering, with `aso run`'s Keeper:
    XRootD 5.5.3 crashes now and then under load here (dmesg: segfaults in libssl and
    libXrdUtils), and once took connections without answering them."""

    def __init__(self, storage: EmbeddedStorage):
        super().__init__(daemon=True)
        self.storage = storage
        self.keeper = Keeper(storage)
        self.active = threading.Event()
        self.active.set()
        self.done = threading.Event()
        self.restarts = 0
        # Held through a check and its restart: a pause waits for a check under way, which
        # could otherwise see a server the test has just killed and start it again (seen in
        # CI: every copy then met a live server and the crash was never felt).
        self.checking = threading.Lock()

    def run(self) -> None:
        while not self.done.wait(0.5):
            with self.checking:
                if self.active.is_set() and self.keeper.check(time.monotonic()):
                    self.restarts += 1

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        with self.checking:
            self.active.clear()
        try:
            yield
        finally:
            self.active.set()


TPC_EVENT = re.compile(r"TPC_PullRequest: event=(\w+), local=(\S+?),")
SERVER_START = re.compile(r"\+\+\+\+\+\+ xrootd \S+ initialization started")


def storage_copies(config: Config, site: str) -> dict[str, list[str]]:
    """The destination server's own record of third-party copies: path → events in order. A
    server (re)start ends, as SERVER_START, the copies it had under way when it died."""
    log = Path(config.storage.data_dir) / site / "log" / "xrootd.log"
    events: dict[str, list[str]] = {}
    for line in log.read_text(errors="replace").splitlines():
        if SERVER_START.search(line):
            for seen in events.values():
                if seen[-1] == "PULL_START":
                    seen.append("SERVER_START")
        elif match := TPC_EVENT.search(line):
            events.setdefault(match.group(2), []).append(match.group(1))
    return events


def assert_never_copied_twice_at_once(
    config: Config, docs: list[dict[str, Any]], site: str = "T2_DE_DESY"
) -> None:
    """From the storage side: every copy into a file ended before the next one began."""
    copies = storage_copies(config, site)
    for doc in docs:
        events = copies.get(doc["destination_lfn"], [])
        assert events and events[0] == "PULL_START", (doc["destination_lfn"], events)
        for before, after in itertools.pairwise(events):
            assert not (before == after == "PULL_START"), (doc["destination_lfn"], events)
        assert events[-1] == "TRANSFER_SUCCESS", (doc["destination_lfn"], events)
        assert events.count("TRANSFER_SUCCESS") == 1, (doc["destination_lfn"], events)
