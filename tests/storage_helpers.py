"""Real embedded storage for tests: sites on free loopback ports in a directory the servers'
account can enter (pytest's own tmp directories are mode 0700, which the `xrootd` user that
root-started servers run as cannot enter)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from aso.config import Config, SiteConfig
from aso.embedded import free_port
from aso.storage import EmbeddedStorage


@contextmanager
def reachable_tmp_dir(prefix: str = "aso-storage-test-") -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix=prefix))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def storage_config(base: Path, site_names: list[str], protocol: str = "https") -> Config:
    """A config whose catalogue is `site_names`, each embedded on two free loopback ports."""
    config = Config(source=base / "aso.toml")
    config.storage.data_dir = str(base / "storage")
    config.storage.start_timeout = 20.0
    config.sites = {
        name: SiteConfig(
            root_url=f"root://127.0.0.1:{free_port()}",
            http_url=f"https://127.0.0.1:{free_port()}",
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


class Watchdog(threading.Thread):
    """Starts again a site server that died, as `aso run` does: XRootD 5.5.3 crashes now and
    then under load here (dmesg: segfaults in libssl and libXrdUtils)."""

    def __init__(self, storage: EmbeddedStorage):
        super().__init__(daemon=True)
        self.storage = storage
        self.active = threading.Event()
        self.active.set()
        self.done = threading.Event()
        self.restarts = 0

    def run(self) -> None:
        while not self.done.wait(0.5):
            if self.active.is_set() and any(s.pid is None for s in self.storage.status()):
                self.storage.start()
                self.restarts += 1

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self.active.clear()
        try:
            yield
        finally:
            self.active.set()
