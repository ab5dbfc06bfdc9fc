"""The `aso` command as users run it: a subprocess, its output and its exit code."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import pkcs12

from aso.config import Config, render
from aso.local.managed import local_store
from aso.local.stores import free_port
from aso.local.xrootd import export_path
from aso.provision.designdocs import known_sites
from tests.conftest import ENGINE, PASSWORD, make_config, write_config
from tests.pipeline_helpers import run_until, wait_for
from tests.storage_helpers import shared_pki

ASO = str(Path(sys.executable).parent / "aso")
REPO = Path(__file__).resolve().parent.parent


def aso(
    *args: str,
    cwd: Path | None = None,
    config: Path | None = None,
    timeout: float = 120,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    argv = [ASO, *(["--config", str(config)] if config else []), *args]
    env = {**{k: v for k, v in os.environ.items() if k != "ASO_CONFIG"}, **(env or {})}
    env["COLUMNS"] = "200"
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The error a user sees: exactly one line on stderr, no traceback."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("aso: error: "), lines[0]
    return lines[0]


COMMANDS = [
    [],
    ["config"],
    ["config", "show"],
    ["config", "init"],
    ["config", "keys"],
    ["store"],
    ["store", "start"],
    ["store", "stop"],
    ["store", "status"],
    ["db"],
    ["db", "init"],
    ["db", "migrate"],
    ["db", "add-user"],
    ["upload"],
    ["request"],
    ["request", "show"],
    ["request", "list"],
    ["site"],
    ["site", "ban"],
    ["site", "drain"],
    ["site", "allow"],
    ["site", "list"],
    ["user"],
    ["user", "ban"],
    ["user", "allow"],
    ["user", "list"],
    ["hold"],
    ["hold", "list"],
    ["hold", "release"],
    ["hold", "cancel"],
    ["notify"],
    ["notify", "add"],
    ["notify", "list"],
    ["notify", "remove"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) or "aso" for c in COMMANDS])
def test_every_command_has_help(command):
    result = aso(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage: aso" in result.stdout
    # The help says what the command does (its docstring's first line, or the group's help).
    assert len(result.stdout.splitlines()) > 4


def test_no_arguments_shows_help(tmp_path):
    result = aso(cwd=tmp_path)
    assert "Usage: aso" in result.stdout + result.stderr
    assert "store" in result.stdout + result.stderr


def test_unknown_config_key_is_one_line_and_exit_2(tmp_path):
    path = tmp_path / "aso.toml"
    path.write_text('[store]\nulr = "http://127.0.0.1:1"\n')
    result = aso("config", "show", config=path)
    assert result.returncode == 2
    line = one_line_error(result)
    assert "unknown key 'store.ulr'" in line and "did you mean 'store.url'" in line


def test_wrong_type_and_bad_toml_and_missing_file(tmp_path):
    path = tmp_path / "aso.toml"
    path.write_text('[store]\nretries = "many"\n')
    result = aso("config", "show", config=path)
    assert result.returncode == 2
    assert "store.retries: expected int, got str" in one_line_error(result)
    path.write_text("[store\n")
    result = aso("config", "show", config=path)
    assert result.returncode == 2 and "not valid TOML" in one_line_error(result)
    result = aso("config", "show", config=tmp_path / "nope.toml")
    assert result.returncode == 2 and "does not exist" in one_line_error(result)


def test_unreachable_store_is_one_line_and_a_retryable_exit(tmp_path):
    config = make_config(tmp_path, free_port(), retries=1)
    path = write_config(config)
    for command in (["db", "init"], ["request", "list"], ["request", "show", "abcd1234"]):
        result = aso(*command, config=path)
        assert result.returncode == 75, (command, result.stdout, result.stderr)  # EX_TEMPFAIL
        line = one_line_error(result)
        assert f"cannot reach the store at {config.store.url}" in line
        assert line.endswith("(retryable: try again later)")


# Every command that reads or writes the store, the store being down: one line saying so and
# the retryable exit code (75, EX_TEMPFAIL; README, docs/usage.md), so that a job wrapper or a
# cron job tries again later instead of giving up.
UNREACHABLE = [
    ["status", "261121_1:alice_t"],
    ["status", "261121_1:alice_t", "--since", "0"],
    ["status", "--file", "abcd1234"],
    ["request", "list", "--task", "261121_1:alice_t", "--json"],
    ["kill", "--task", "261121_1:alice_t"],
    ["resubmit", "--task", "261121_1:alice_t"],
    ["publish", "--retry", "261121_1:alice_t"],
    ["catalog", "ls", "/Prim/proc-v1/USER"],
    ["catalog", "blocks", "/Prim/proc-v1/USER"],
    ["stats"],
    ["reconcile", "--kind", "stuck"],
    ["metrics", "targets"],
    ["store", "check"],
    ["db", "add-user", "carla", "--password", "pw"],
]


@pytest.mark.parametrize("command", UNREACHABLE, ids=[" ".join(c) for c in UNREACHABLE])
def test_each_command_meeting_a_store_that_is_down_exits_75(tmp_path, command):
    config = make_config(tmp_path, free_port(), retries=1)
    result = aso(*command, config=write_config(config))
    assert result.returncode == 75, (result.stdout, result.stderr)
    line = one_line_error(result)
    assert f"cannot reach the store at {config.store.url}" in line
    assert line.endswith("(retryable: try again later)")


# The panels of `aso --help`, in their order, and the commands of each.
HELP_PANELS = {
    "For users and clients": {"status", "upload", "kill", "resubmit", "publish", "request",
                              "hold", "notify"},
    "For operators": {"run", "config", "store", "db", "storage", "catalog", "reconcile", "stats",
                      "certs", "metrics", "site", "user"},
    "The service's processes, the demo and the simulator": {"agent", "frontend", "demo", "sim"},
}  # fmt: skip


def help_panels(text: str) -> dict[str, list[str]]:
    """The commands of each panel of a rich help text (`╭─ Title ─...╮`, then `│ name  ...`)."""
    panels: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        title = re.match(r"╭─ (.+?) ─+╮", line)
        if title:
            current = panels.setdefault(title.group(1), [])
        elif current is not None and re.match(r"│ [a-z]", line):
            current.append(line[2:].split()[0])
    return panels


def test_help_groups_the_commands_by_who_uses_them():
    """`aso --help`: the users' commands first, then the operators', then the service's
    processes; every command in one panel."""
    from aso.cli import app

    result = aso("--help")
    assert result.returncode == 0, result.stderr
    panels = help_panels(result.stdout)
    assert list(panels) == ["Options", *HELP_PANELS]
    assert {name: set(commands) for name, commands in panels.items() if name != "Options"} == (
        HELP_PANELS
    )
    registered = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    assert set().union(*HELP_PANELS.values()) == registered
    assert panels["For users and clients"][0] == "status"  # what a user asks first


def test_config_init_show_and_secrets(tmp_path):
    path = tmp_path / "sub" / "aso.toml"
    result = aso("config", "init", str(path))
    assert result.returncode == 0, result.stderr
    assert path.stat().st_mode & 0o777 == 0o600
    again = aso("config", "init", str(path))
    assert again.returncode == 2 and "exists" in one_line_error(again)
    assert aso("config", "init", str(path), "--if-missing").returncode == 0
    shown = aso("config", "show", config=path)
    assert shown.returncode == 0
    assert 'admin_password = "********"' in shown.stdout
    secret = aso("config", "show", "--secrets", config=path)
    assert "********" not in secret.stdout
    keys = aso("config", "keys")
    assert "store.url" in keys.stdout and "embedded.data_dir" in keys.stdout
    # On a pipe: tab-separated, a header first, every meaning whole (a table cut them at 80).
    lines = keys.stdout.splitlines()
    assert lines[0] == "key\tdefault\tmeaning" and all(line.count("\t") == 2 for line in lines)
    described = json.loads(aso("config", "keys", "--json").stdout)
    by_key = {d["key"]: d for d in described}
    assert len(described) == len(lines) - 1 and by_key["store.url"]["default"].startswith("http")
    assert any(by_key["store.url"]["meaning"] in line for line in lines)


def test_store_lifecycle_through_the_cli(tmp_path):
    """start → status → start again (no second process) → db init twice → upload twice →
    list → stop, and stop touches only its own process. On the engine under test: the status
    of a CouchDB that refuses anonymous requests (require_valid_user) is "answering" too."""
    config = make_config(tmp_path, free_port())
    path = write_config(config)
    pid_file = local_store(config).pid_file
    try:
        started = aso("store", "start", config=path)
        assert started.returncode == 0, started.stderr
        assert f"{ENGINE} store started" in started.stdout
        pid = int(pid_file.read_text())
        status = aso("store", "status", config=path)
        assert status.returncode == 0 and f"pid {pid}" in status.stdout
        assert "answering" in status.stdout
        again = aso("store", "start", config=path)
        assert "already running" in again.stdout and int(pid_file.read_text()) == pid

        first = aso("db", "init", config=path)
        assert first.returncode == 0, first.stderr
        assert "created database asynctransfer" in first.stdout
        assert "design document _design/asyncstageout written" in first.stdout
        second = aso("db", "init", config=path)
        assert "created database" not in second.stdout
        assert "design document _design/asyncstageout unchanged" in second.stdout

        demo = REPO / "deploy" / "demo" / "requests.json"
        up = aso("upload", "--file", str(demo), "--json", config=path)
        assert up.returncode == 0, up.stderr
        answer = json.loads(up.stdout)
        assert len(answer["recorded"]) == 3 and answer["refused"] == {}
        up_again = aso("upload", "--file", str(demo), "--json", config=path)
        assert sorted(json.loads(up_again.stdout)["already"]) == sorted(answer["recorded"])
        listing = aso("request", "list", "--task", "261121_120000:demo_crab_ttbar", config=path)
        assert listing.returncode == 0 and listing.stdout.count("\tnew\t") == 3
        shown = aso("request", "show", answer["recorded"][0], config=path)
        assert json.loads(shown.stdout)["_id"] == answer["recorded"][0]
        # The ids a listing shows (their first 12 characters) are taken wherever an id is.
        short = listing.stdout.splitlines()[1].split("\t")[0]
        assert len(short) == 12 and any(r.startswith(short) for r in answer["recorded"])
        by_prefix = aso("request", "show", short, config=path)
        assert by_prefix.returncode == 0 and json.loads(by_prefix.stdout)["_id"].startswith(short)
        story = aso("status", "--file", short, config=path)
        assert story.returncode == 0 and "recorded as new" in story.stdout
        listed = json.loads(aso("request", "list", "--task", "261121_120000:demo_crab_ttbar",
                                "--json", config=path).stdout)  # fmt: skip
        assert listed["total"] == 3 and sorted(r["id"] for r in listed["requests"]) == sorted(
            answer["recorded"])  # fmt: skip
        cut = aso("request", "list", "--task", "261121_120000:demo_crab_ttbar", "--limit", "1",
                  config=path)  # fmt: skip
        assert cut.stdout.count("\tnew\t") == 1 and "2 more: --limit N, or --all" in cut.stdout
        everything = aso("request", "list", "--state", "new", "--all", "--json", config=path)
        assert json.loads(everything.stdout)["total"] == 3
        missing = aso("request", "show", "f" * 64, config=path)
        assert missing.returncode == 1
        bad_state = aso("request", "list", "--state", "flying", config=path)
        assert bad_state.returncode == 2 and "unknown state" in one_line_error(bad_state)

        # A second config on another data dir: its stop must not touch our store.
        other = make_config(tmp_path / "other", free_port())
        (tmp_path / "other").mkdir()
        other_path = write_config(other)
        stopped_other = aso("store", "stop", config=other_path)
        assert "not running" in stopped_other.stdout
        assert aso("store", "status", config=path).returncode == 0
    finally:
        stopped = aso("store", "stop", config=path)
    assert stopped.returncode == 0 and f"stopped (pid {pid})" in stopped.stdout
    status = aso("store", "status", config=path)
    assert status.returncode == 1 and "not answering" in status.stdout
    assert not pid_file.exists()


def test_start_refuses_a_port_taken_by_another_server(store_config, tmp_path):
    """Another server answers at the URL: say so, do not start a second store."""
    config = Config(source=tmp_path / "aso.toml")
    config.store = store_config.store
    config.embedded.data_dir = str(tmp_path / "store")
    path = tmp_path / "aso.toml"
    path.write_text(render(config, show_secrets=True))
    result = aso("store", "start", config=path)
    assert result.returncode == 1
    assert "another server already answers" in one_line_error(result)


def local_json(tmp_path) -> Path:
    path = tmp_path / "one.json"
    path.write_text(
        '[{"user": "alice", "task": "261121_1:alice_down", "job_id": "1", "source": "T2_CH_CERN", '
        '"destination": "T2_DE_DESY", "source_lfn": "/store/temp/user/alice/d.root", '
        '"destination_lfn": "/store/user/alice/d.root", "size": 5, "adler32": "0000000a"}]'
    )
    return path


def test_an_upload_naming_an_unknown_site_is_refused_with_the_sites_known(
    tmp_path, store_config, files_db, accounts
):
    """Issue 18, finding 7, as a user sees it from `aso upload`: the store refuses the request
    (exit 1), says which site and which sites it knows, and records nothing."""
    path = tmp_path / "aso.toml"
    config = Config(source=path)
    config.store = dataclasses.replace(
        store_config.store, files_db=files_db, user="alice", password=PASSWORD
    )
    path.write_text(render(config, show_secrets=True))
    base = ["upload", "--task", "261121_1:alice_nowhere", "--job-id", "3", "--size", "5"]
    base += ["--adler32", "0000000a", "--source", "T2_CH_CERN"]
    lfns = ["--source-lfn", "/store/temp/user/alice/nowhere/a.root",
            "--destination-lfn", "/store/user/alice/nowhere/a.root"]  # fmt: skip
    refused = aso(*base, "--destination", "T2_XX_Nowhere", *lfns, config=path)
    assert refused.returncode == 1, refused.stderr
    assert "0 recorded, 0 already recorded, 1 refused" in refused.stdout

    said = " ".join(refused.stderr.split())  # as one line, however the console wrapped it
    assert '[site] destination "T2_XX_Nowhere" is not a site of this ASO (its sites: ' in said
    assert f"(its sites: {', '.join(known_sites(store_config))})" in said
    listed = aso("request", "list", "--task", "261121_1:alice_nowhere", config=path)
    assert listed.returncode == 0 and "T2_XX_Nowhere" not in listed.stdout
    recorded = aso(*base, "--destination", "T2_DE_DESY", *lfns, config=path)
    assert recorded.returncode == 0 and "1 recorded" in recorded.stdout, recorded.stderr


def test_upload_write_puts_the_job_s_output_with_the_user_s_own_proxy(
    tmp_path, store_config, files_db, accounts, storage
):
    """Issue 37: `aso upload --write` writes the local file at the source, in the user's
    temporary area, with the user's proxy, then records it; with another user's proxy the site
    refuses the write and nothing is recorded."""
    path = tmp_path / "aso.toml"
    config = Config(source=path)
    config.store = dataclasses.replace(
        store_config.store, files_db=files_db, user="alice", password=PASSWORD
    )
    config.sites, config.storage, config.frontend = storage.sites, storage.storage, storage.frontend
    path.write_text(render(config, show_secrets=True))
    local = tmp_path / "out.root"
    local.write_bytes(os.urandom(10_000))
    certs = shared_pki()
    task = f"261207_1:alice_write{os.getpid()}"
    base = ["upload", "--write", "--task", task, "--source", "T2_CH_CERN"]
    base += ["--destination", "T2_DE_DESY", "--local-file", str(local)]

    def lfns(n: int) -> list[str]:
        return ["--job-id", str(n), "--source-lfn", f"/store/temp/user/alice/{task}/out_{n}.root",
                "--destination-lfn", f"/store/user/alice/{task}/out_{n}.root"]  # fmt: skip

    as_bob = aso(*base, *lfns(2), config=path, env={"X509_USER_PROXY": str(certs / "x509up_bob")})
    assert as_bob.returncode == 1 and "writing davs://" in one_line_error(as_bob), as_bob.stderr
    written = aso(
        *base, *lfns(1), config=path, env={"X509_USER_PROXY": str(certs / "x509up_alice")}
    )
    assert written.returncode == 0 and "1 recorded" in written.stdout, written.stderr
    assert "wrote davs://127.0.0.1:" in written.stderr
    on_disk = export_path(storage, "T2_CH_CERN", f"/store/temp/user/alice/{task}/out_1.root")
    assert on_disk.read_bytes() == local.read_bytes()
    assert not on_disk.with_name("out_2.root").exists()
    listed = aso("request", "list", "--task", task, config=path)
    assert listed.returncode == 0 and listed.stdout.count(task) == 1, listed.stdout


def test_upload_errors(tmp_path, store_config, files_db):
    path = tmp_path / "aso.toml"
    config = Config(source=path)
    config.store = dataclasses.replace(store_config.store, files_db=files_db)
    path.write_text(render(config, show_secrets=True))
    missing = aso("upload", "--task", "t1", config=path)
    assert missing.returncode == 2 and "give --file or all of" in one_line_error(missing)
    bad = tmp_path / "bad.json"
    bad.write_text(
        '[{"task": "t", "job_id": "1", "source": "T2_CH_CERN", '
        '"destination": "T2_DE_DESY", "source_lfn": "/store/temp/user/a/x.root", '
        '"destination_lfn": "/store/user/a/x.root", "size": -5, "adler32": "1"}]'
    )
    result = aso("upload", "--file", str(bad), config=path)
    assert result.returncode == 2  # a bad request file is bad usage
    assert "item 0: doc.size must be >= 0" in one_line_error(result)
    # Missing and unknown fields, in the file's terms (not Python's).
    bad.write_text('[{"task": "t", "job_id": "1", "source": "T2_CH_CERN"}]')
    result = aso("upload", "--file", str(bad), config=path)
    assert result.returncode == 2
    assert one_line_error(result).endswith(
        "item 0: missing destination, source_lfn, destination_lfn, size, adler32"
    )
    bad.write_text('[{"task": "t", "job_id": "1", "source": "T2_CH_CERN", "destination": "x", '
                   '"source_lfn": "x", "destination_lfn": "x", "size": 1, "adler32": "1", '
                   '"checksum": "1"}]')  # fmt: skip
    result = aso("upload", "--file", str(bad), config=path)
    assert result.returncode == 2 and "item 0: unknown field 'checksum'" in one_line_error(result)
    bad.write_text('[{"task": "t", "job_id": "1", "source": "T2_CH_CERN", "destination": '
                   '"T2_DE_DESY", "source_lfn": "/tmp/x.root", "destination_lfn": '
                   '"/store/user/a/x", "size": 1, "adler32": "1"}]')  # fmt: skip
    result = aso("upload", "--file", str(bad), config=path)
    assert one_line_error(result).endswith(
        'item 0: doc.source_lfn "/tmp/x.root" is not an LFN naming a file: /store/ and parts of '
        "letters, digits and _.+=:@,- separated by single slashes (no empty, . or .. part, no "
        "trailing slash)"
    )  # a meaning, not a regular expression
    assert "keyword" not in result.stderr and "Traceback" not in result.stderr
    local = tmp_path / "out.root"
    local.write_bytes(b"ASO" * 1000)
    ok = aso(
        "upload",
        "--user",
        "alice",
        "--task",
        "261121_1:alice_local",
        "--job-id",
        "7",
        "--source",
        "T2_CH_CERN",
        "--destination",
        "T2_DE_DESY",
        "--source-lfn",
        "/store/temp/user/alice/local/out.root",
        "--destination-lfn",
        "/store/user/alice/local/out.root",
        "--local-file",
        str(local),
        "--json",
        config=path,
    )
    assert ok.returncode == 0, ok.stderr
    [doc_id] = json.loads(ok.stdout)["recorded"]
    shown = json.loads(aso("request", "show", doc_id, config=path).stdout)
    assert shown["size"] == 3000
    assert shown["checksum"]["adler32"] == f"{zlib.adler32(b'ASO' * 1000):08x}"
    bad.write_text("{not json")
    result = aso("upload", "--file", str(bad), config=path)
    assert result.returncode == 2 and "not valid JSON" in one_line_error(result)
    # `aso`'s own options are taken after the sub-command too.
    late = aso("upload", "--file", str(local_json(tmp_path)), "--json", "--config", str(path))
    assert late.returncode == 0, late.stderr
    assert set(json.loads(late.stdout)) == {"recorded", "already", "renewed", "refused"}
    assert "INFO" not in late.stderr  # a line per cycle, not per recorded file
    # The store unreachable: a retryable error with its own exit code (EX_TEMPFAIL).
    config.store = dataclasses.replace(config.store, url=f"http://127.0.0.1:{free_port()}")
    path.write_text(render(config, show_secrets=True))
    down = aso("upload", "--file", str(local_json(tmp_path)), config=path)
    assert down.returncode == 75
    message = one_line_error(down)
    assert "cannot reach the store" in message and message.endswith("(retryable: try again later)")


def test_an_agent_writes_its_threads_stacks_on_sigusr1_and_goes_on(sim_config):
    """What an operator does with an agent that runs but does nothing: `kill -USR1 PID`."""
    config_file = write_config(sim_config)
    log = sim_config.source.parent / "analytics.log"
    with open(log, "w") as out:
        agent = subprocess.Popen(
            [ASO, "--config", str(config_file), "agent", "analytics", "--instance", "usr1"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: "analytics usr1 starting" in log.read_text(), 60, "the agent to start")
        agent.send_signal(signal.SIGUSR1)
        # The dump is written thread by thread: wait for the main thread's, whichever comes last.
        wait_for(lambda: "aso/runtime.py" in log.read_text(), 30, "its stacks")
        text = log.read_text()
        assert "most recent call first" in text
        # The main thread's stack: the daemon loop, where it waits between two cycles.
        assert "Current thread" in text or "Thread 0x" in text
        assert "aso/runtime.py" in text and "in run" in text
        assert agent.poll() is None  # a look, not a stop
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(30) == 0
    finally:
        if agent.poll() is None:
            agent.kill()


def test_an_agent_stuck_past_hang_timeout_writes_its_stacks_and_exits(tmp_path):
    """A store that accepts the connection and never answers: the agent's first request
    waits for it (read timeout 600 s). With `agents.hang_timeout` it writes its threads'
    stacks and exits with code 1 for its supervisor to start it again; without, it waits."""
    black_hole = socket.socket()
    black_hole.bind(("127.0.0.1", 0))
    black_hole.listen(8)  # connections complete in the kernel; nobody ever answers
    agents = {}
    try:
        # Both at once: the watched one exits after its 3 s; the other is still waiting well
        # past that (four times the watched one's timeout).
        for hang_timeout in (3.0, 0.0):
            home = tmp_path / f"hang-{hang_timeout:g}"
            home.mkdir()
            config = make_config(home, black_hole.getsockname()[1], read_timeout=600.0)
            config.store.retries = 0
            config.agents.hang_timeout = hang_timeout
            config_file = write_config(config)
            agents[hang_timeout] = subprocess.Popen(
                [ASO, "--config", str(config_file), "agent", "analytics", "--instance", "stuck"],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        started = time.monotonic()
        try:
            code = agents[3.0].wait(30)
        except subprocess.TimeoutExpired:
            code = None
        time.sleep(max(0.0, started + 12.0 - time.monotonic()))
        unwatched_still_waiting = agents[0.0].poll() is None
    finally:
        for agent in agents.values():
            if agent.poll() is None:
                agent.kill()
            agent.wait()
        black_hole.close()
    output = agents[3.0].stdout.read()
    assert code == 1, output
    assert "Timeout (0:00:03)!" in output
    assert "aso/store/couchapi.py" in output and "aso/runtime.py" in output  # where it waited
    assert unwatched_still_waiting, agents[0.0].stdout.read()  # no watchdog: still waiting


def test_an_error_on_the_built_in_defaults_says_no_config_file_was_found(tmp_path):
    """Run outside the checkout with no config file: whatever the store at the default address
    answers (nothing, or 401), the one-line error says the built-in defaults were used."""
    home_config = Path.home() / ".config" / "aso" / "aso.toml"
    if home_config.exists() or Path("/etc/aso/aso.toml").exists():
        pytest.skip("a config file is installed on this machine")
    result = aso("request", "list", cwd=tmp_path)
    assert result.returncode in (1, 75)
    assert one_line_error(result).endswith(
        "no config file was found, so the built-in defaults were used: give --config PATH or "
        "set $ASO_CONFIG (`aso config init` writes one)"
    )


def test_certs_demo_writes_a_throw_away_pki_through_the_cli(tmp_path):
    """`aso certs demo DIR --user U` (docs/usage.md): a CA, a grid-mapfile mapping the users,
    the users' proxies, each path printed; for each user a PKCS#12 file a browser imports (the
    certificate, its key and the CA, under the password in `<user>.p12.password`, 0600), and
    the steps to open the monitoring pages with it on the config's front end port
    (docs/frontend.md)."""
    config = tmp_path / "aso.toml"
    config.write_text('[frontend]\nlisten = "127.0.0.1:9443"\n')
    certs = tmp_path / "certs"
    result = aso("certs", "demo", str(certs), "--user", "carla", "--user", "dan", config=config)
    assert result.returncode == 0, result.stderr
    table, _, steps = result.stdout.partition("\n\n")
    printed = dict(line.split(None, 1) for line in table.splitlines())
    paths = {k: Path(p.strip()) for k, p in printed.items()}
    assert paths and all(p.exists() for p in paths.values()), printed
    mapfile = next(p for p in paths.values() if "grid-mapfile" in p.name)
    assert "carla" in mapfile.read_text() and "dan" in mapfile.read_text()

    ca_cert = x509.load_pem_x509_certificate(paths["ca"].read_bytes())
    for user in ("carla", "dan"):
        p12, password_file = paths[f"{user}.p12"], paths[f"{user}.p12.password"]
        assert p12 == certs / f"{user}.p12"
        assert password_file == certs / f"{user}.p12.password"
        assert password_file.stat().st_mode & 0o777 == 0o600
        assert p12.stat().st_mode & 0o777 == 0o600
        password = password_file.read_text().strip()
        assert len(password) >= 16
        with pytest.raises(ValueError):
            pkcs12.load_key_and_certificates(p12.read_bytes(), b"not " + password.encode())
        key, cert, extra = pkcs12.load_key_and_certificates(p12.read_bytes(), password.encode())
        user_cert = x509.load_pem_x509_certificate(paths[f"{user}.cert"].read_bytes())
        assert cert is not None and key is not None
        assert cert.subject == user_cert.subject and cert == user_cert
        assert key.public_key() == user_cert.public_key()
        assert ca_cert in extra
        # Told where it is and where its password is, and the CA to trust for websites.
        line = next(line for line in steps.splitlines() if str(p12.resolve()) in line)
        assert line.split() == [str(p12.resolve()), "(password:", f"{password_file.resolve()})"]
    assert password != paths["carla.p12.password"].read_text().strip()  # one each
    assert "aso-operator.p12" not in printed and "aso-agent-host.p12" not in printed

    assert steps.startswith("To open the monitoring pages in a browser:")
    assert f"Import the demo CA, {paths['ca'].resolve()}, as an authority for websites" in steps
    assert "Your certificates → Import" in steps and "Authorities → Import" in steps
    assert "the monitoring pages' address that `aso run` prints (https://127.0.0.1:9443/" in steps


def test_certs_proxy_renews_a_demo_user_s_proxy_through_the_cli(tmp_path):
    """`aso certs proxy WHO --dir DIR` (docs/frontend.md): a demo proxy lasts 12 hours; a
    fresh one is made from the user's certificate and key, valid as long as asked, and one of
    a user `aso certs demo` did not make is refused with why."""
    import datetime as dt

    certs = tmp_path / "certs"
    assert aso("certs", "demo", str(certs), "--user", "carla").returncode == 0
    proxy = certs / "x509up_carla"
    before = proxy.read_bytes()
    result = aso("certs", "proxy", "carla", "--dir", str(certs), "--hours", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{proxy} (valid 2 hours)"
    assert proxy.read_bytes() != before and proxy.stat().st_mode & 0o777 == 0o600
    leaf = x509.load_pem_x509_certificates(proxy.read_bytes())[0]
    user = x509.load_pem_x509_certificate((certs / "carla-cert.pem").read_bytes())
    assert leaf.issuer == user.subject
    left = leaf.not_valid_after_utc - dt.datetime.now(dt.UTC)
    assert dt.timedelta(hours=1.9) < left <= dt.timedelta(hours=2)
    missing = aso("certs", "proxy", "zed", "--dir", str(certs))
    assert missing.returncode == 2 and "run `aso certs demo" in missing.stderr


# Each command's bad usage, as people type it: exit code 2 and one line saying what is wrong
# (and where the usage is), before any store is needed (docs/usage.md's exit codes).
BAD_USAGE = [
    (["nope"], "No such command 'nope'. (`aso --help` shows the usage)"),
    (["status"], "give a TASK, or --file ID"),
    (["status", "t", "--bogus"], "No such option: --bogus (`aso status --help`"),
    (["status", "--file", "ab"], "request id 'ab' is too short"),
    (["request", "list", "--limit", "0"], "Invalid value for '--limit'"),
    (["request", "list", "--state", "flying"], "unknown state 'flying'"),
    (["request", "show"], "Missing argument 'DOC_ID'"),
    (["request", "show", "abc"], "request id 'abc' is too short"),
    (["upload"], "give --file or all of"),
    (["kill"], "Missing option '--task'"),
    (["resubmit"], "Missing option '--task'"),
    (["publish", "t"], "--retry"),
    (["stats", "--by", "planet"], "'planet' is not one of"),
    (["catalog", "ls"], "Missing argument 'DATASET'"),
    (["agent", "nobody"], "unknown agent 'nobody'"),
    (["config", "show", "--config", "/nonexistent/aso.toml"], "does not exist"),
    (["store", "nope"], "No such command 'nope'"),
    (["reconcile", "--kind", "nope"], "nope"),
]


@pytest.mark.parametrize(("argv", "says"), BAD_USAGE, ids=[" ".join(a) for a, _ in BAD_USAGE])
def test_bad_usage_is_exit_2_and_one_line(tmp_path, argv, says):
    result = aso(*argv, cwd=tmp_path)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert says.lower() in one_line_error(result).lower()


def test_db_migrate_rewrites_what_earlier_versions_left_and_the_agents_finish_it(
    pub_config, accounts, admin
):
    """Documents an earlier 0.1.0 left in `acquired` and `publishing` (written past today's
    validation, as only a store admin can): `aso db migrate` rewrites them once, then finds
    nothing; the agents finish every file as they finish today's. An intent whose job the
    service has is followed to `done`; one whose job it never got, once its lease has ended,
    is released and copied; one without a lease is queued again; a killed one ends `killed`;
    a file left `publishing` in a block the catalog holds is published in that block, which
    the catalog holds once."""
    from aso.agents.monitor import Monitor
    from aso.agents.publisher import Publisher
    from aso.agents.submitter import Submitter
    from aso.catalog.embedded import EmbeddedCatalog
    from aso.core.publication import make_block
    from aso.core.submission import file_transfer, job_request
    from aso.runtime import Runner
    from aso.transfer import open_service
    from aso.transfer.base import job_id_for
    from tests.pipeline_helpers import (
        LINKS,
        left_as,
        plant_as_earlier_versions_left_them,
        states,
        upload,
    )

    config, path = pub_config, write_config(pub_config)
    clean = aso("db", "migrate", config=path)
    assert clean.returncode == 0, clean.stderr
    assert clean.stdout.strip() == "nothing to migrate"

    db = admin.db(config.store.files_db)
    ids = upload(accounts, config, 5, users=("alice",), links=LINKS[:1])
    dataset = "/Prim/alice-mig-v1/USER"
    outputs = upload(accounts, config, 2, users=("alice",), links=LINKS[:1],
                     task="261121_120001:alice_mig", publish=True,
                     publish_info={"dataset": dataset, "events": 1, "parents": []})  # fmt: skip
    docs = [db.get(i) for i in ids + outputs]
    now = time.time()
    ended = now - 60  # the earlier submitter's leases have ended

    def lease(key):
        return {"owner": "submitter-old", "until": ended, "job_key": key}

    killed = left_as(docs[4], "state", "acquired", ended - 300, lease=lease("k-killed"))
    legacy = [
        left_as(docs[0], "state", "acquired", ended - 300, lease=lease("k-ran")),
        left_as(docs[1], "state", "acquired", ended - 300, lease=lease("k-ran")),
        left_as(docs[2], "state", "acquired", ended - 300, lease=lease("k-never")),
        left_as(docs[3], "state", "acquired", ended - 300),
        left_as(killed, "state", "kill_requested", ended - 200),  # its owner's kill
    ]
    published = []
    for doc in docs[5:]:
        for to in ("submitted", "done"):
            doc = left_as(doc, "state", to, ended - 300)
        published.append(doc)
    block = make_block(published)
    catalog = EmbeddedCatalog(admin.db(config.store.catalog_db))
    catalog.publish_block(block)  # the earlier publisher's catalog call went through
    legacy += [
        left_as(d, "publication", "publishing", ended - 100, publication_block=block.name)
        for d in published
    ]
    plant_as_earlier_versions_left_them(admin, config, legacy)
    service = open_service(config)  # the job the earlier submitter did submit
    try:
        ran = legacy[:2]
        files = tuple(file_transfer(config, d) for d in ran)
        service.submit(job_request(config, "k-ran", ran, files))
    finally:
        service.close()

    migrated = aso("db", "migrate", config=path)
    assert migrated.returncode == 0, migrated.stderr
    lines = migrated.stdout.splitlines()
    assert lines[0].startswith("3 acquired → submitted") and lines[1].startswith("1 acquired → new")
    assert lines[2].startswith("1 kill_requested: the job of its key recorded")
    assert lines[3].startswith("2 publishing → pending") and lines[4] == "7 documents migrated"
    stored = db.get_many(ids + outputs)
    assert states(db, ids) == {"submitted": 3, "new": 1, "kill_requested": 1}
    for doc_id, key in zip(ids[:5], ("k-ran", "k-ran", "k-never", None, "k-killed"), strict=True):
        doc = stored[doc_id]
        assert (doc.get("transfer") or {}).get("job_id") == (job_id_for(key) if key else None)
        assert doc.get("lease") == (lease(key) if key else None)
        # A kill whose job is recorded changes no state: no history entry of its own.
        assert (doc["history"][-1]["by"] == "aso-db-migrate") == (key != "k-killed")
    for doc_id in outputs:
        assert stored[doc_id]["publication"] == "pending"
        assert block.name in stored[doc_id]["history"][-1]["reason"]
    again = aso("db", "migrate", config=path)
    assert again.returncode == 0 and again.stdout.strip() == "nothing to migrate"

    runners = [Runner(Monitor(config, "m1")), Runner(Submitter(config, "s1")),
               Runner(Publisher(config, "p1"))]  # fmt: skip
    finished = {"done": 4, "killed": 1}
    run_until(
        lambda: (
            states(db, ids) == finished
            and {d["publication"] for d in db.get_many(outputs).values()} == {"published"}
        ),
        runners,
        describe=lambda: (
            states(db, ids),
            [d["publication"] for d in db.get_many(outputs).values()],
        ),
    )
    stored = db.get_many(ids + outputs)
    for doc_id in ids[:2]:  # followed: the job the earlier submitter made
        assert [a["job_id"] for a in stored[doc_id]["attempts"]] == [job_id_for("k-ran")]
    reasons = [h.get("reason") for h in stored[ids[2]]["history"]]
    assert "lease expired, no job" in reasons  # released once its job was fenced, then copied
    assert stored[ids[2]]["attempts"][0]["fenced"] == "absent"
    assert stored[ids[4]]["attempts"][-1]["fenced"] == "absent"
    assert {stored[i]["publication_block"] for i in outputs} == {block.name}
    assert catalog.dataset_files(dataset) == {
        block.name: sorted(stored[i]["destination_lfn"] for i in outputs)
    }
