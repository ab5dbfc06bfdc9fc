"""`make bench`: the lifecycle simulator at 2x, 4x and 8x design load, one after the other on
this machine, each on a fresh local store with every agent running, for a fixed simulated
time (long enough for the backlog to settle), then a drain. With several engines
(`--engines pouchdb,couchdb`, `make bench STORE=both`) each scale runs on each store back to
back, and a table puts them side by side with the highest scale that holds on each.

Printed, one line per scale: completed/expected in the steady state, the highest backlog and
its growth over the second half, latency percentiles (injection → done, the same without the
simulated transfer time, done → published), the store's write rate against its bulk-write
ceiling measured in the same run (on the same store, just before the agents start), whether
the scale holds, and whether the accounting is exact. Plots of all scales go to `--plots`.

    python -m aso.sim.bench_scale [--scales 2,4,8] [--duration 150s] [--interval 10s]
                              [--engines pouchdb,couchdb] [--plots docs/bench]
                              [--workdir var/bench-scale]
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from rich.console import Console

from aso.sim.lifecycle import RunOptions, run_simulation
from aso.sim.report import Report
from aso.sim.workload import Plan, parse_duration

console = Console()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", default="2,4,8", help="Multiples of design, comma-separated.")
    parser.add_argument("--duration", default="120s", help="Simulated injection time per scale.")
    parser.add_argument("--interval", default="10s", help="Simulated time between injections.")
    parser.add_argument("--compression", type=float, default=1.0)
    # Shorter than production's waits (simulated seconds) so that the drain after the
    # injection, which waits for the last retries and catalog blocks, stays short.
    parser.add_argument("--block-timeout", type=float, default=15.0)
    parser.add_argument("--retry-delay", type=float, default=10.0)
    parser.add_argument("--transfer-timeout", type=float, default=60.0)
    parser.add_argument("--ceiling-docs", type=int, default=5000)
    # A multiple of the injection interval: every row holds the same number of injections.
    parser.add_argument("--bucket", default="20s", help="Simulated time per report row.")
    parser.add_argument("--drain-timeout", type=float, default=300.0, help="Wall seconds.")
    parser.add_argument("--workdir", type=Path, default=Path("var/bench-scale"))
    parser.add_argument("--plots", type=Path, default=Path("docs/bench"))
    parser.add_argument("--store-url", default=None, help="Run against this store instead.")
    parser.add_argument(
        "--engines",
        default="pouchdb",
        help="Local stores to run on, comma-separated: pouchdb, couchdb ($COUCHDB_HOME).",
    )
    return parser.parse_args(argv)


def plot_all(reports: list[Report], out: Path, engine: str = "pouchdb") -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, draw in (("completed", Report.draw_completed), ("backlog", Report.draw_backlog)):
        fig, axes = plt.subplots(1, len(reports), figsize=(5 * len(reports), 3.6), squeeze=False)
        for ax, report in zip(axes[0], reports, strict=True):
            draw(report, ax)
        fig.tight_layout()
        prefix = "scale" if engine == "pouchdb" else f"scale-{engine}"
        paths.append(out / f"{prefix}-{name}.png")
        fig.savefig(paths[-1], dpi=90)
        plt.close(fig)
    return paths


def side_by_side(reports: dict[str, list[Report]]) -> list[str]:
    """A markdown table: one row per scale, each engine's figures side by side, then the
    highest scale that holds on each."""
    engines = list(reports)
    head = ["scale"] + [
        f"{e}: {what}" for e in engines for what in ("completed/expected", "overhead p95", "holds")
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    scales = [r.plan.scale for r in reports[engines[0]]]
    for index, scale in enumerate(scales):
        cells = [f"{scale:g}x"]
        for engine in engines:
            steady = reports[engine][index].steady
            p95 = steady["overhead"]["p95"]
            cells += [
                f"{steady['ratio']}",
                "?" if p95 is None else f"{p95:.0f} s",
                "yes" if steady["holds"] else "**no**",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    for engine in engines:
        held = [r.plan.scale for r in reports[engine] if r.steady["holds"]]
        best = f"{max(held):g}x" if held else "none of these"
        lines.append(f"highest scale that holds on {engine}: {best}")
    return lines


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    scales = [float(s) for s in args.scales.split(",") if s.strip()]
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not engines or any(e not in ("pouchdb", "couchdb") for e in engines):
        raise SystemExit("--engines: pouchdb and/or couchdb")
    started = time.monotonic()
    reports: dict[str, list[Report]] = {engine: [] for engine in engines}
    for scale in scales:
        for engine in engines:
            name = f"{scale:g}x" if engine == "pouchdb" else f"{engine}-{scale:g}x"
            workdir = args.workdir / name
            shutil.rmtree(workdir, ignore_errors=True)
            plan = Plan(
                scale=scale,
                duration=parse_duration(args.duration),
                interval=parse_duration(args.interval),
                compression=args.compression,
                block_timeout=args.block_timeout,
                retry_delay=args.retry_delay,
                transfer_timeout=args.transfer_timeout,
            )
            options = RunOptions(
                workdir=workdir,
                store_url=args.store_url,
                engine=engine,
                bucket=parse_duration(args.bucket),
                drain_timeout=args.drain_timeout,
                ceiling_docs=args.ceiling_docs,
                # Each scale on a fresh store: the same requests, so the same fates, every run.
                run_token=f"bench_{scale:g}x",
            )
            console.rule(
                f"{scale:g}x design on {engine}: {plan.files_per_second * 3600:,.0f} files/hour"
            )
            report = run_simulation(plan, options, console)
            console.print(report.summary_line(), markup=False, highlight=False)
            reports[engine].append(report)
    console.rule("results")
    paths = []
    summary = {}
    for engine, runs in reports.items():
        for report in runs:
            console.print(f"{engine}: {report.summary_line()}", markup=False, highlight=False)
            summary[f"{engine}-{report.plan.scale:g}x"] = report.to_dict() | {"rows": None}
        paths += plot_all(runs, args.plots, engine)
    for line in side_by_side(reports):
        console.print(line, markup=False, highlight=False)
    args.workdir.mkdir(parents=True, exist_ok=True)
    (args.workdir / "summary.json").write_text(json.dumps(summary, indent=1))
    console.print(
        f"plots: {', '.join(map(str, paths))}; reports in {args.workdir}/*/report; "
        f"wall time {time.monotonic() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
