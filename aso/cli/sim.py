"""`aso sim`: the lifecycle simulator (sim/lifecycle.py) from the command line. aso/cli/__init__.py
registers `sim_cmd`. It needs no config file: the run writes its own into its workspace."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from aso.cli.common import line_console, print_json
from aso.config import DISTRIBUTIONS, ENGINES, one_of

console = line_console()
err_console = line_console(stderr=True)


def parse_duration(text: str) -> float:
    """Seconds of `90`, `90s`, `15m`, `2h` or `1d` (sim/workload.py), a bad parameter else."""
    from aso.sim.workload import parse_duration as seconds

    try:
        return seconds(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def parse_moment(text: str) -> float:
    """A time in the run: `0` (its start) or a duration after it."""
    return 0.0 if text.strip() in ("0", "0s") else parse_duration(text)


def parse_size(text: str) -> int:
    """Bytes of `20GB`, `500MB`, `20GiB` or `1000000` (sim/workload.py), a bad parameter else."""
    from aso.sim.workload import parse_size as size

    try:
        return size(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def parse_instances(values: list[str]) -> dict[str, int]:
    from aso.sim.lifecycle import AGENTS

    counts = dict.fromkeys(AGENTS, 1)
    for value in values:
        agent, _, number = value.partition("=")
        if agent not in AGENTS or not number.isdigit() or int(number) < 1:
            raise typer.BadParameter(
                f"{value!r}: expected AGENT=N (N >= 1) with AGENT one of {', '.join(AGENTS)}"
            )
        counts[agent] = int(number)
    return counts


def parse_outage(value: str, error_class: str = "connection") -> dict[str, float | str]:
    """SITE:START-END (a site down, or with `error_class` frozen: timeout, full: quota), or
    USER@SITE:START-END (a site refusing a user: permission), in simulated time."""
    where, _, span = value.partition(":")
    user, _, site = where.rpartition("@")
    start, _, end = span.partition("-")
    try:
        begin, finish = parse_moment(start), parse_duration(end)
    except typer.BadParameter:
        begin = finish = -1.0
    wanted = "USER@SITE:START-END" if error_class == "permission" else "SITE:START-END"
    if not site or begin < 0 or finish <= begin or bool(user) != (error_class == "permission"):
        raise typer.BadParameter(
            f"{value!r}: expected {wanted} in simulated time, e.g. "
            f"{'alice@' if user or error_class == 'permission' else ''}T2_SM_Site003:10m-20m"
        )
    outage: dict[str, float | str] = {"site": site, "start": begin, "end": finish}
    if error_class != "connection":
        outage["class"] = error_class
    if user:
        outage["user"] = user
    return outage


QUOTA_FORMS = "SITE:SIZE@START-END, SITE:SIZE or SITE:START-END, e.g. T2_SM_Site003:20GB@10m-20m"


def parse_quota(value: str, injection: float) -> dict[str, float | str]:
    """A full destination: SITE:START-END (full for that time), SITE:SIZE@START-END (from START
    it takes SIZE bytes, then is full until END, when the limit is lifted) or SITE:SIZE (the
    same from the run's start to the end of its injection, `injection` simulated seconds)."""
    site, _, spec = value.partition(":")
    size, at, span = spec.partition("@")
    if not at and "-" in spec:
        return parse_outage(value, "quota")
    if not site:
        raise typer.BadParameter(f"{value!r}: expected {QUOTA_FORMS}")
    try:
        limit = parse_size(size)
        window = parse_outage(f"{site}:{span}", "quota") if at else None
    except typer.BadParameter as exc:
        raise typer.BadParameter(f"{value!r}: expected {QUOTA_FORMS} ({exc})") from None
    quota = window or {"site": site, "class": "quota", "start": 0.0, "end": injection}
    return {**quota, "bytes": limit}


def sim_cmd(
    scale: Annotated[
        float, typer.Option(help="Load as a multiple of design (300k files/day).")
    ] = 1.0,
    duration: Annotated[
        str, typer.Option(help="Simulated time of injection: 90s, 15m, 2h, 1d.")
    ] = "1h",
    compression: Annotated[
        float, typer.Option(help="Simulated seconds per wall second (time compression).")
    ] = 1.0,
    users: Annotated[int, typer.Option(help="Users injecting work in parallel.")] = 200,
    sites: Annotated[int, typer.Option(help="Sites files come from and go to.")] = 60,
    interval: Annotated[str, typer.Option(help="Simulated time between two injections.")] = "1m",
    mean_duration: Annotated[
        float, typer.Option(help="Mean simulated transfer time, seconds.")
    ] = 20.0,
    distribution: Annotated[
        str, typer.Option(help="Transfer times: exponential, lognormal or fixed.")
    ] = "exponential",
    failure_rate: Annotated[
        float, typer.Option(help="Probability that one transfer attempt fails.")
    ] = 0.02,
    transfer_timeout: Annotated[
        float, typer.Option(help="Simulated seconds a transfer may take before it times out.")
    ] = 3600.0,
    retry_delay: Annotated[
        float, typer.Option(help="Simulated cool-off after a first failed attempt, seconds.")
    ] = 60.0,
    block_timeout: Annotated[
        float, typer.Option(help="Simulated seconds a catalog block waits for more files.")
    ] = 300.0,
    outage: Annotated[
        list[str] | None,
        typer.Option(help="A site outage SITE:START-END in simulated time (repeatable)."),
    ] = None,
    frozen: Annotated[
        list[str] | None,
        typer.Option(help="A site frozen (copies time out) SITE:START-END (repeatable)."),
    ] = None,
    quota: Annotated[
        list[str] | None,
        typer.Option(
            help="A destination full (quota): SITE:START-END, full for that time; or "
            "SITE:SIZE@START-END (SIZE e.g. 20GB, 500MB, 20GiB; bytes plain): from START it "
            "takes copies until SIZE bytes landed, then is full until END, when the limit is "
            "lifted; SITE:SIZE the same from the start to the end of the injection (repeatable)."
        ),
    ] = None,
    forbid: Annotated[
        list[str] | None,
        typer.Option(help="A destination refusing a user USER@SITE:START-END (repeatable)."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of every random draw.")] = 1,
    instances: Annotated[
        list[str] | None, typer.Option(help="Agent instances, AGENT=N (repeatable).")
    ] = None,
    uploaders: Annotated[int, typer.Option(help="Upload threads (job wrappers at once).")] = 8,
    workdir: Annotated[
        Path | None, typer.Option(help="Workspace (default var/sim/<time>): config, logs, report.")
    ] = None,
    store_url: Annotated[
        str | None,
        typer.Option(
            help="Run against this store (http://admin:pw@host:5984; fresh databases) instead "
            "of a local one of its own."
        ),
    ] = None,
    engine: Annotated[
        str,
        typer.Option(
            help="The run's own local store: pouchdb (embedded) or couchdb ($COUCHDB_HOME, "
            "else /opt/couchdb)."
        ),
    ] = "pouchdb",
    nodes: Annotated[
        int,
        typer.Option(
            min=1,
            max=9,
            help="--engine couchdb: nodes of the run's store, a cluster on loopback; agent host "
            "k talks to node k (round robin).",
        ),
    ] = 1,
    kill_node: Annotated[
        list[int] | None,
        typer.Option(
            help="With --nodes 2 or more: SIGKILL this node (1..N) midway, start it again 3 s "
            "later; given twice or more, the nodes one after the other, spread evenly over "
            "the injection."
        ),
    ] = None,
    bucket: Annotated[
        str | None, typer.Option(help="Simulated time per report row (default: fits the run).")
    ] = None,
    ceiling: Annotated[
        bool, typer.Option(help="Measure the store's bulk-write ceiling first.")
    ] = True,
    drain_timeout: Annotated[
        float, typer.Option(help="Wall seconds to wait for every file to end after injection.")
    ] = 900.0,
    hosts: Annotated[
        int,
        typer.Option(help="Agent hosts: `aso run --agents-only` processes, each with every agent."),
    ] = 1,
    chaos: Annotated[
        bool,
        typer.Option(
            help="Faults during the injection: kill -9 an agent every --chaos-every s, restart "
            "the store twice, a storage outage, a failing link (docs/testing.md: Chaos)."
        ),
    ] = False,
    chaos_every: Annotated[
        float, typer.Option(help="Wall seconds between two agent kills with --chaos.")
    ] = 5.0,
    kill_host: Annotated[
        str | None,
        typer.Option(help="With --hosts 2 or more: kill this host (e.g. sim2) for good midway."),
    ] = None,
    lease: Annotated[
        str | None,
        typer.Option(
            help="The agents' lease (transfer.lease, e.g. 20s; default production's 5 min): "
            "files a killed host or a write contested by a cluster left submitted go on when it "
            "ends, so a short run with --kill-host or --kill-node wants a short one."
        ),
    ] = None,
    profile_store: Annotated[
        bool,
        typer.Option(
            help="Profile the store over the injection after its warm-up: the embedded store's"
            " CPU profile by kind of work, or CouchDB's counters (docs/performance.md)."
        ),
    ] = False,
    progress: Annotated[bool, typer.Option(help="Show live progress.")] = True,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the whole report as JSON.")
    ] = False,
) -> None:
    """Drive the whole service with synthetic work and report how it held (docs/benchmarks.md,
    The lifecycle simulator). Exit code 1 when the accounting is not exact."""
    from aso.sim.chaos import ChaosPlan
    from aso.sim.lifecycle import RunOptions, host_ids, run_simulation
    from aso.sim.workload import Plan

    injection = parse_duration(duration)
    try:
        plan = Plan(
            scale=scale,
            users=users,
            sites=sites,
            interval=parse_duration(interval),
            duration=injection,
            compression=compression,
            mean_duration=mean_duration,
            distribution=distribution,
            failure_rate=failure_rate,
            transfer_timeout=transfer_timeout,
            retry_delay=retry_delay,
            block_timeout=block_timeout,
            outages=[
                *(parse_outage(o) for o in outage or []),
                *(parse_outage(o, "timeout") for o in frozen or []),
                *(parse_quota(o, injection) for o in quota or []),
                *(parse_outage(o, "permission") for o in forbid or []),
            ],
            seed=seed,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    kill_nodes = tuple(kill_node or ())
    _check_run(distribution, hosts, engine, nodes, store_url, kill_nodes, kill_host, host_ids)
    chaos_plan = _chaos_plan(ChaosPlan, chaos, chaos_every, kill_host, kill_nodes)
    lease_seconds = parse_duration(lease) if lease else None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    options = RunOptions(
        workdir=workdir or Path("var/sim") / stamp,
        store_url=store_url,
        engine=engine,
        nodes=nodes,
        instances=parse_instances(instances or []),
        uploaders=uploaders,
        bucket=parse_duration(bucket) if bucket else None,
        measure_ceiling=ceiling,
        drain_timeout=drain_timeout,
        progress=progress,
        hosts=hosts,
        chaos=chaos_plan,
        lease=lease_seconds,
        profile_store=profile_store,
    )
    err_console.print(
        f"simulating {plan.scale:g}x design ({plan.files_per_second * 86400:,.0f} files/day) "
        f"for {plan.duration:g} simulated s ({plan.wall(plan.duration):.0f} wall s), "
        f"{plan.users} users, {plan.sites} sites; workspace {options.workdir}"
    )
    report = run_simulation(plan, options, err_console)
    _show(report, options.workdir, json_out)
    if not report.accounting.exact:
        for line in report.accounting.problems():
            err_console.print(f"aso sim: accounting: {line}", markup=False)
        raise typer.Exit(1)


def _check_run(
    distribution: str,
    hosts: int,
    engine: str,
    nodes: int,
    store_url: str | None,
    kill_nodes: tuple[int, ...],
    kill_host: str | None,
    host_ids: Any,
) -> None:
    """The options that depend on each other, checked before anything starts."""
    if distribution not in DISTRIBUTIONS:
        raise typer.BadParameter(f"--distribution must be {one_of(DISTRIBUTIONS)}")
    if hosts < 1:
        raise typer.BadParameter("--hosts must be at least 1")
    if engine not in ENGINES:
        raise typer.BadParameter(f"--engine must be {one_of(ENGINES)}")
    if nodes > 1 and (engine != "couchdb" or store_url):
        raise typer.BadParameter("--nodes needs --engine couchdb (and no --store-url)")
    if kill_nodes and (nodes < 2 or any(not 1 <= index <= nodes for index in kill_nodes)):
        raise typer.BadParameter(f"--kill-node must be a node 1..{nodes} (--nodes 2 or more)")
    if kill_host is not None and kill_host not in host_ids(hosts)[1:]:
        raise typer.BadParameter(
            f"--kill-host {kill_host!r}: expected one of {', '.join(host_ids(hosts)[1:]) or '—'} "
            "(the first host stays; --hosts 2 or more)"
        )


def _chaos_plan(
    plan_class: Any,
    chaos: bool,
    chaos_every: float,
    kill_host: str | None,
    kill_nodes: tuple[int, ...],
) -> Any:
    """The faults of the run: every kind with --chaos, else only the host's or the nodes'
    deaths asked for, else none."""
    try:
        if chaos:
            return plan_class(kill_every=chaos_every, kill_host=kill_host, kill_nodes=kill_nodes)
        if kill_host or kill_nodes:
            return plan_class(
                kill_every=None,
                store_restarts=0,
                outages=False,
                kill_host=kill_host,
                kill_nodes=kill_nodes,
            )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    return None


def _show(report: Any, workdir: Path, json_out: bool) -> None:
    if json_out:
        print_json(console, report.to_dict())
        return
    console.print(report.summary_line(), markup=False, highlight=False)
    for line in report.extra_lines():
        console.print(line, markup=False, highlight=False)
    console.print(f"report: {workdir / 'report'} (report.json, completed.png, backlog.png)")
