"""The store a benchmark runs on: one given by URL, or a fresh embedded store of its own."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from aso.config import Config
from aso.local.embedded import EmbeddedStore
from aso.local.stores import free_port


@contextmanager
def bench_store(url: str | None) -> Iterator[tuple[Config, EmbeddedStore | None]]:
    """A config for `url` (admin credentials in it: a real CouchDB), or for a fresh embedded
    store on a free port with data in a temporary directory, started here and stopped at the
    end; with the embedded store (None for a URL)."""
    with tempfile.TemporaryDirectory(prefix="aso-bench-") as tmp:
        config = Config(source=Path(tmp) / "aso.toml")
        embedded = None
        if url:
            parts = urlsplit(url)
            config.store.url = f"{parts.scheme}://{parts.hostname}:{parts.port or 5984}"
            config.store.admin_user = parts.username or "admin"
            config.store.admin_password = parts.password or ""
        else:
            config.store.url = f"http://127.0.0.1:{free_port()}"
            config.store.admin_password = "bench-admin"
            config.embedded.data_dir = str(Path(tmp) / "store")
            embedded = EmbeddedStore(config)
            embedded.start()
        try:
            yield config, embedded
        finally:
            if embedded:
                embedded.stop()
