"""Benchmark: what one third-party copy between two embedded XRootD sites costs, with their
authentication on (docs/design.md, "Real storage on one machine"): copies of one file size, one
after another, through aso.gfal2client as the copier makes them (the agents' certificate),
per protocol. Printed per protocol: median, mean, min and max
seconds per copy.

    python -m aso.sim.bench_tpc [--copies 20] [--size 1048576] [--protocol https --protocol root]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

from rich.console import Console
from rich.table import Table

from aso import gfal2client, sites
from aso.config import Config
from aso.local.xrootd import write_file
from aso.sim.bench_confirm import embedded_sites

console = Console()


def one_copy(config: Config, protocol: str, size: int) -> float:
    """Seconds of one verified copy of a new file of `size` bytes from the first site to the
    second."""
    source, destination = sorted(config.sites)
    stored = write_file(config, source, f"/store/temp/user/bench/{uuid.uuid4().hex}", size)
    src = sites.pfn(config, source, stored.lfn, protocol)
    dst = sites.pfn(config, destination, f"/store/user/bench/{uuid.uuid4().hex}", protocol)
    ctx = gfal2client.new_context(config)
    params = gfal2client.transfer_parameters(ctx, adler32=stored.adler32)
    events = gfal2client.TransferEvents()
    params.event_callback = events
    start = time.perf_counter()
    ctx.filecopy(params, src, dst)
    took = time.perf_counter() - start
    if not events.third_party:
        raise SystemExit(f"{protocol}: not a third-party copy ({events.types})")
    return took


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=20)
    parser.add_argument("--size", type=int, default=1 << 20, help="bytes per file")
    parser.add_argument("--protocol", action="append", choices=("https", "root"))
    args = parser.parse_args(argv)
    protocols = args.protocol or ["https", "root"]
    table = Table(title=f"{args.copies} copies of {args.size} bytes, one after another")
    for column in ("protocol", "median s", "mean s", "min s", "max s"):
        table.add_column(column, justify="right")
    with embedded_sites(2) as config:
        gfal2client.import_gfal2(config)
        for protocol in protocols:
            times = [one_copy(config, protocol, args.size) for _ in range(args.copies)]
            table.add_row(
                protocol,
                *(f"{f(times):.3f}" for f in (statistics.median, statistics.mean, min, max)),
            )
    console.print(table)


if __name__ == "__main__":
    main()
