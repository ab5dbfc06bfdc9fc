"""Benchmark: what confirming files at their destination costs (the publisher's look at every
file before the catalog; the monitor's at copies the service did not verify): gfal2 stat and
adler32 of each file on embedded XRootD sites (plain HTTP on loopback, as the default embedded
sites), through aso.files.Confirmer as the agents use it (all sites at once, 8 looks at a time
per site), and one look after another for comparison.

Each round looks at every file: the first after the files were written (XRootD computes each
adler32 by reading the file), then again (what a second look costs). Printed per round: wall
seconds, ms per file and files per second.

    python -m aso.sim.bench_confirm [--files 400] [--size 1048576] [--sites 2]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from rich.console import Console
from rich.table import Table

from aso import sites
from aso.config import Config, SiteConfig
from aso.files import Confirmer, Look, open_files
from aso.local import pki
from aso.local.stores import distinct_free_ports
from aso.local.xrootd import EmbeddedStorage, write_file

console = Console()


@contextlib.contextmanager
def embedded_sites(count: int) -> Iterator[Config]:
    """`count` embedded XRootD sites on free loopback ports, in a directory the servers'
    account can enter."""
    base = Path(tempfile.mkdtemp(prefix="aso-bench-confirm-"))
    base.chmod(0o755)
    config = Config(source=base / "aso.toml")
    config.storage.data_dir = str(base / "storage")
    pki.demo(base / "certs", [])  # the sites' grid PKI and the agents' certificate (defaults)
    ports = iter(distinct_free_ports(2 * count))
    config.sites = {
        f"T2_XX_Bench{n}": SiteConfig(
            root_url=f"root://127.0.0.1:{next(ports)}",
            http_url=f"https://127.0.0.1:{next(ports)}",
            protocol="https",
        )
        for n in range(count)
    }
    storage = EmbeddedStorage(config)
    storage.start()
    try:
        yield config
    finally:
        storage.stop()
        shutil.rmtree(base, ignore_errors=True)


def placed(config: Config, files: int, size: int) -> list[Look]:
    """`files` files of `size` bytes spread over the sites: the looks that confirm them."""
    names = sorted(config.sites)
    looks = []
    for n in range(files):
        site = names[n % len(names)]
        lfn = f"/store/user/bench/confirm/f{n:06d}.root"
        stored = write_file(config, site, lfn, size)
        looks.append(Look(lfn, site, sites.pfn(config, site, lfn), stored.size, stored.adler32))
    return looks


def timed(run: Callable[[], int]) -> tuple[float, int]:
    start = time.perf_counter()
    confirmed = run()
    return time.perf_counter() - start, confirmed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=400)
    parser.add_argument("--size", type=int, default=1 << 20, help="bytes per file")
    parser.add_argument("--sites", type=int, default=2)
    args = parser.parse_args(argv)

    with embedded_sites(args.sites) as config:
        files = open_files(config)
        looks = placed(config, args.files, args.size)
        confirmer = Confirmer(files)
        serial = looks[: max(1, len(looks) // 4)]

        def all_at_once() -> int:
            found = confirmer.look_all(looks, within=3600)
            for key, finding in found.items():
                if not finding.confirmed:
                    console.print(f"not confirmed: {key}: {finding.verdict} ({finding.detail})")
            return sum(f.confirmed for f in found.values())

        def one_after_another() -> int:
            return sum(files.confirm(look.url, look.size, look.adler32) is None for look in serial)

        rounds = [
            ("Confirmer, first look", len(looks), timed(all_at_once)),
            ("Confirmer, second look", len(looks), timed(all_at_once)),
            ("one after another", len(serial), timed(one_after_another)),
        ]
        confirmer.close()

    table = Table(
        title=f"{args.files} files of {args.size} bytes on {args.sites} embedded sites (HTTP)"
    )
    for column in ("round", "files", "confirmed", "seconds", "ms/file", "files/s"):
        table.add_column(column, justify="right")
    for name, count, (seconds, confirmed) in rounds:
        table.add_row(
            name,
            str(count),
            str(confirmed),
            f"{seconds:.2f}",
            f"{1000 * seconds / count:.2f}",
            f"{count / seconds:.0f}",
        )
    console.print(table)


if __name__ == "__main__":
    main()
