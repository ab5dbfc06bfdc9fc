"""deploy/systemd and deploy/compose: the checks that can run without systemd as PID 1 or a
container engine, and `aso store start --foreground` (what aso-store.service runs).

- systemd: install.sh renders the units for the checkout (ExecStart is this .venv's aso, so it
  exists) into a temporary directory; `systemd-analyze verify` must pass them without a word;
  every agent of agents.AGENTS has its templated unit, run as `aso agent NAME --instance %H-%i`,
  stopped within aso.supervisor.GRACE.
- compose: compose.yaml against the Compose Specification's JSON Schema
  (deploy/compose/schema/compose-spec.json, vendored from compose-spec/compose-spec, Apache-2.0;
  see its README), then what the schema cannot see: every service, volume, network, config and
  secret named exists, every host file mounted is in the repository, published ports are
  unique, every ${VARIABLE} is in env.example, the ASO config it writes loads, and the CouchDB
  nodes end with the intended settings (the ini files of deploy/couchdb/ in order, the image's
  entrypoint left to set the admin and secret). The Dockerfile's COPY sources exist and pass
  its .dockerignore.
- the foreground store really serves (as the same pid: exec), tells systemd it is ready,
  refuses a second start, stops on SIGTERM, and stops the server when the admin is wrong.
"""

from __future__ import annotations

import array
import configparser
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
import yaml

from aso import config as aso_config
from aso.agents import AGENTS
from aso.local.embedded import EmbeddedStore
from aso.local.managed import local_store
from aso.local.stores import free_port, notify_systemd
from aso.store import Server, Settings
from aso.supervisor import GRACE
from tests.conftest import ENGINE, make_config, only_on, write_config

TOP = Path(__file__).resolve().parent.parent
SYSTEMD = TOP / "deploy" / "systemd"
COMPOSE = TOP / "deploy" / "compose"
ASO = Path(sys.executable).with_name("aso")
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


# --- systemd ---------------------------------------------------------------------------------
def render(dest: Path, prefix: Path = TOP) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SYSTEMD / "install.sh"), "--prefix", str(prefix), "--dest", str(dest)],
        capture_output=True,
        text=True,
        check=False,
    )


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A unit file as {section: {key: [values, in order]}} (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def one(unit: dict[str, dict[str, list[str]]], section: str, key: str) -> str:
    values = unit[section][key]
    assert len(values) == 1, f"{section}.{key} given {len(values)} times"
    return values[0]


@pytest.fixture(scope="module")
def units(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("units")
    result = render(dest)
    assert result.returncode == 0, result.stderr
    return dest


def analyze(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SYSTEMD_ANALYZE), "verify", "--man=no", *map(str, paths)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_install_script_knows_every_agent() -> None:
    listed = re.search(r'^AGENTS="([^"]*)"', (SYSTEMD / "install.sh").read_text(), re.M)
    assert listed, "install.sh has no AGENTS line"
    assert sorted(listed.group(1).split()) == sorted(AGENTS)


def test_every_agent_has_its_templated_unit(units: Path) -> None:
    rendered = {p.name for p in units.glob("aso-*@.service")}
    assert rendered == {f"aso-{agent}@.service" for agent in AGENTS}
    assert "gfal-worker" in AGENTS  # `aso run` adds it for transfer.backend = gfal
    for agent in AGENTS:
        unit = parse_unit(units / f"aso-{agent}@.service")
        exec_start = one(unit, "Service", "ExecStart")
        assert exec_start == f"{ASO} agent {agent} --instance %H-%i"
        assert one(unit, "Service", "SyslogIdentifier") == f"aso-{agent}"
        assert one(unit, "Install", "DefaultInstance") == "0"


@pytest.mark.parametrize(
    "name", ["aso-submitter@.service", "aso-frontend.service", "aso-store.service"]
)
def test_units_run_as_aso_supervised_and_confined(units: Path, name: str) -> None:
    unit = parse_unit(units / name)
    service = unit["Service"]
    assert one(unit, "Service", "User") == "aso"
    assert "ASO_CONFIG=/etc/aso/aso.toml" in " ".join(service["Environment"]).split()
    assert one(unit, "Service", "ExecStart").startswith(f"{ASO} ")
    assert one(unit, "Service", "Restart") == "on-failure"
    assert one(unit, "Service", "RestartPreventExitStatus") == "2"  # ASO's bad-config code
    assert {"StartLimitIntervalSec", "StartLimitBurst"} <= unit["Unit"].keys()
    assert one(unit, "Service", "KillMode") == "mixed"
    assert one(unit, "Service", "StandardOutput") == "journal"
    for limit in ("MemoryMax", "MemoryHigh", "LimitNOFILE", "TasksMax"):
        assert limit in service, f"{name}: no {limit}"
    assert one(unit, "Service", "NoNewPrivileges") == "yes"
    assert one(unit, "Service", "ProtectSystem") == "strict"
    assert one(unit, "Service", "PrivateTmp") == "yes"
    assert one(unit, "Service", "StateDirectory") == "aso"  # the one writable place
    assert one(unit, "Unit", "PartOf") == "aso.target"
    assert one(unit, "Install", "WantedBy") == "aso.target"


def test_agents_get_the_supervisors_grace(units: Path) -> None:
    for agent in AGENTS:
        unit = parse_unit(units / f"aso-{agent}@.service")
        assert one(unit, "Service", "TimeoutStopSec") == f"{GRACE:.0f}s"


def test_store_unit_runs_the_foreground_store(units: Path) -> None:
    unit = parse_unit(units / "aso-store.service")
    assert one(unit, "Service", "ExecStart") == f"{ASO} store start --foreground"
    assert one(unit, "Service", "Type") == "notify"
    assert one(unit, "Service", "NotifyAccess") == "all"  # READY=1 comes from the helper
    assert one(parse_unit(units / "aso-frontend.service"), "Service", "ExecStart") == (
        f"{ASO} frontend"
    )


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_passes_every_unit(units: Path) -> None:
    paths = sorted(units.iterdir())
    result = analyze(*paths)
    ours = [line for line in result.stderr.splitlines() if "aso" in line]
    assert result.returncode == 0 and not ours, result.stderr


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    """The check above can fail: a missing executable and an unknown key are reported."""
    assert render(tmp_path, prefix=tmp_path / "nowhere").returncode == 0
    assert analyze(tmp_path / "aso-monitor@.service").returncode != 0
    good = tmp_path / "good"
    assert render(good).returncode == 0
    unit = good / "aso-frontend.service"
    unit.write_text(unit.read_text().replace("KillMode=mixed", "KillMode=mixed\nKillMood=x"))
    assert "KillMood" in analyze(unit).stderr


def test_install_script_refuses_a_relative_prefix(tmp_path: Path) -> None:
    result = render(tmp_path, prefix=Path("opt/aso"))
    assert result.returncode == 2 and "absolute" in result.stderr


# --- compose ---------------------------------------------------------------------------------
COMPOSE_FILE = COMPOSE / "compose.yaml"
VARIABLE = re.compile(r"\$\{([A-Z0-9_]+)[^}]*\}")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def schema_validator() -> Any:
    schema = json.loads((COMPOSE / "schema" / "compose-spec.json").read_text())
    return jsonschema_rs.validator_for(schema)


def test_compose_file_follows_the_compose_specification(compose: dict[str, Any]) -> None:
    errors = [str(e) for e in schema_validator().iter_errors(compose)]
    assert not errors, errors


def test_the_schema_rejects_what_compose_would(compose: dict[str, Any]) -> None:
    """The validation above can fail: a misspelt key and a bad condition are errors."""
    broken = json.loads(json.dumps(compose))
    broken["services"]["frontend"]["depend_on"] = ["db-init"]
    assert not schema_validator().is_valid(broken)
    broken = json.loads(json.dumps(compose))
    broken["services"]["db-init"]["depends_on"]["cluster-setup"]["condition"] = "done"
    assert not schema_validator().is_valid(broken)


def volume_source(entry: str | dict[str, Any]) -> str:
    return entry.get("source", "") if isinstance(entry, dict) else entry.split(":", 1)[0]


def test_compose_names_only_what_it_defines(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on unknown {dependency}"
        for network in service.get("networks", []):
            assert network in compose.get("networks", {}), f"{name}: network {network}"
        for kind in ("configs", "secrets"):
            for entry in service.get(kind, []):
                source = entry["source"] if isinstance(entry, dict) else entry
                assert source in compose.get(kind, {}), f"{name}: {kind} {source}"
        for entry in service.get("volumes", []):
            source = volume_source(entry)
            if not source.startswith((".", "/")):
                assert source in compose.get("volumes", {}), f"{name}: volume {source}"
        assert not ("network_mode" in service and "networks" in service), name


def test_compose_mounts_files_of_the_repository(compose: dict[str, Any]) -> None:
    mounted = [
        volume_source(entry)
        for service in compose["services"].values()
        for entry in service.get("volumes", [])
    ]
    mounted += [s["file"] for s in compose.get("secrets", {}).values() if "file" in s]
    local = [m for m in mounted if m.startswith(".")]
    assert local, "no host file mounted: the check below checks nothing"
    for path in local:
        assert (COMPOSE / path).is_file(), f"{path} (from {COMPOSE_FILE}) does not exist"
    for path in mounted:
        assert path.startswith(".") or "${" in path or not path.startswith("/"), (
            f"{path}: an absolute host path; make it a variable of env.example"
        )


def test_compose_builds_from_files_that_exist(compose: dict[str, Any]) -> None:
    builds = [s["build"] for s in compose["services"].values() if "build" in s]
    assert builds
    for build in builds:
        context = (COMPOSE / build["context"]).resolve()
        assert (context / build["dockerfile"]).is_file()
        assert context == TOP


def test_compose_publishes_each_host_port_once(compose: dict[str, Any]) -> None:
    published = [
        str(port).rsplit(":", 1)[0]  # [IP:]HOST_PORT of "[IP:]HOST_PORT:CONTAINER_PORT"
        for service in compose["services"].values()
        for port in service.get("ports", [])
    ]
    assert published and len(published) == len(set(published)), published


def test_every_variable_is_in_env_example(compose: dict[str, Any]) -> None:
    used = set(VARIABLE.findall(COMPOSE_FILE.read_text()))
    example = COMPOSE / "env.example"
    listed = {
        line.split("=", 1)[0]
        for line in example.read_text().splitlines()
        if "=" in line and not line.startswith("#")
    }
    assert used == listed


def loaded_config(compose: dict[str, Any]) -> aso_config.Config:
    """The ASO config compose.yaml writes, variables replaced, loaded as `aso` loads it."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "aso.toml"
        path.write_text(VARIABLE.sub("x", compose["configs"]["aso_toml"]["content"]))
        return aso_config.load(str(path))  # an unknown or misspelt key is an error


def test_compose_writes_a_config_aso_loads(compose: dict[str, Any]) -> None:
    config = loaded_config(compose)
    assert config.store.url.startswith("http://couchdb1.aso:")
    assert config.frontend.auth == "proxy"
    # the image's user aso may write only under its home (the Dockerfile's useradd)
    assert str(config.path(config.agents.log_dir)).startswith("/var/lib/aso/")
    assert config.transfer.backend == "fts3"
    secrets = {s["source"] for s in compose["services"]["agents-host-a"]["secrets"]}
    assert config.fts3.proxy == f"/run/secrets/{secrets.pop()}"


def dockerfile_copies(text: str) -> list[str]:
    """The sources of the Dockerfile's COPY instructions from the build context."""
    sources: list[str] = []
    for line in text.replace("\\\n", " ").splitlines():
        words = line.split()
        if not words or words[0].upper() != "COPY":
            continue
        if any(w.startswith("--from") for w in words):
            continue
        sources += [w for w in words[1:-1] if not w.startswith("--")]
    return sources


def test_dockerfile_copies_files_that_exist_and_are_sent() -> None:
    sources = dockerfile_copies((COMPOSE / "Dockerfile").read_text())
    assert len(sources) >= 5
    allowed = {
        line[1:]
        for line in (COMPOSE / "Dockerfile.dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    for source in sources:
        assert (TOP / source).exists(), f"COPY {source}: not in the repository"
        assert source.rstrip("/") in allowed, f"COPY {source}: excluded by the .dockerignore"


# The official couchdb:3 image: its entrypoint (docker-entrypoint.sh) appends the admin of
# COUCHDB_USER/COUCHDB_PASSWORD and the secret of COUCHDB_SECRET to local.d/docker.ini, the last
# file CouchDB reads (and the one it writes), unless a local.d/*.ini has the line right after
# the section header: then that file's value (deploy/couchdb's CHANGE-ME) would win.
LOCAL_D = "/opt/couchdb/etc/local.d/"
ENTRYPOINT_SKIPS = {
    "admin": re.compile(r"\[admins\]\n{user} ="),
    "secret": re.compile(r"\[chttpd_auth\]\nsecret ="),
}


def couchdb_nodes(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    nodes = {k: s for k, s in compose["services"].items() if s.get("image") == "couchdb:3"}
    assert len(nodes) == 3, sorted(nodes)
    return nodes


def ini_mounts(service: dict[str, Any]) -> list[tuple[str, Path]]:
    """(name in local.d, file in the repository) of a node's ini files, in CouchDB's order."""
    mounts = []
    for entry in service["volumes"]:
        source, target = entry.split(":")[:2]
        if target.startswith(LOCAL_D):
            mounts.append((target.removeprefix(LOCAL_D), (COMPOSE / source).resolve()))
    return sorted(mounts)


def couchdb_setting(files: list[Path], section: str, key: str) -> str | None:
    """The value CouchDB ends with: the last of the files (in order) that sets it."""
    value = None
    for path in files:
        parser = configparser.ConfigParser(
            inline_comment_prefixes=(";",), strict=False, interpolation=None
        )
        parser.read_string(path.read_text())
        if parser.has_option(section, key):
            value = parser.get(section, key)
    return value


def test_couchdb_nodes_read_the_same_ini_files_before_docker_ini(
    compose: dict[str, Any],
) -> None:
    chains = [ini_mounts(node) for node in couchdb_nodes(compose).values()]
    assert chains[0] and all(chain == chains[0] for chain in chains)
    names = [name for name, _ in chains[0]]
    assert all(name.endswith(".ini") and name < "docker.ini" for name in names), names
    for entry in next(iter(couchdb_nodes(compose).values()))["volumes"]:
        if LOCAL_D in entry:
            assert entry.endswith(":ro"), entry


def test_couchdb_keeps_its_data_on_its_volume(compose: dict[str, Any]) -> None:
    for name, node in couchdb_nodes(compose).items():
        files = [path for _, path in ini_mounts(node)]
        data = [e.split(":")[1] for e in node["volumes"] if not e.startswith(".")]
        assert len(data) == 1, name
        for key in ("database_dir", "view_index_dir"):
            assert couchdb_setting(files, "couchdb", key) == data[0], (name, key)
        assert couchdb_setting(files, "couchdb", "single_node") == "false"
        assert couchdb_setting(files, "chttpd", "bind_address") == "0.0.0.0"


def test_couchdb_admin_and_secret_come_from_the_environment(compose: dict[str, Any]) -> None:
    config = loaded_config(compose)
    for node in couchdb_nodes(compose).values():
        env = node["environment"]
        assert env["COUCHDB_USER"] == config.store.admin_user
        assert {"COUCHDB_PASSWORD", "COUCHDB_SECRET", "COUCHDB_ERLANG_COOKIE"} <= env.keys()
        assert "NODENAME" in env
        user = re.escape(env["COUCHDB_USER"])
        for _, path in ini_mounts(node):
            text = path.read_text()
            assert not re.search(ENTRYPOINT_SKIPS["admin"].pattern.format(user=user), text)
            assert not ENTRYPOINT_SKIPS["secret"].search(text), path
    # The front end's proxy-auth secret is the nodes' [chttpd_auth] secret.
    assert env["COUCHDB_SECRET"] == "${ASO_PROXY_SECRET:?set ASO_PROXY_SECRET}"
    assert '"${ASO_PROXY_SECRET}"' in compose["configs"]["aso_toml"]["content"]


# --- the foreground store --------------------------------------------------------------------
class NotifySocket:
    """A stand-in for systemd's notification socket: collects the messages sent to it, and
    closes the file descriptors of BARRIER=1 as systemd does."""

    def __init__(self, path: Path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.5)
        self.messages: list[str] = []
        self.ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        fd_size = array.array("i").itemsize
        while not self._stop.is_set():
            try:
                data, ancillary, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(4 * fd_size))
            except TimeoutError:
                continue
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds = array.array("i")
                    fds.frombytes(payload[: len(payload) - len(payload) % fd_size])
                    for fd in fds:
                        os.close(fd)
            self.messages.append(data.decode())
            if "READY=1" in data.decode().splitlines():
                self.ready.set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[NotifySocket]:
    receiver = NotifySocket(tmp_path / "notify")
    yield receiver
    receiver.close()


def foreground(config_file: Path, notify: Path | None = None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    if notify is not None:
        env["NOTIFY_SOCKET"] = str(notify)
    return subprocess.Popen(
        [str(ASO), "--config", str(config_file), "store", "start", "--foreground"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def stop(process: subprocess.Popen[str]) -> str:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    return output


def test_notify_without_a_socket_sends_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify_systemd("READY=1") is False


def test_foreground_store_serves_as_the_server_and_stops_on_sigterm(
    tmp_path: Path, notify_socket: NotifySocket
) -> None:
    config = make_config(tmp_path, free_port())
    config_file = write_config(config)
    process = foreground(config_file, notify_socket.path)
    try:
        assert notify_socket.ready.wait(90), (notify_socket.messages, stop(process))
        # exec: the process we started is the server itself, which systemd then supervises
        argv = Path(f"/proc/{process.pid}/cmdline").read_bytes().split(b"\0")
        server = b"pouchdb-server" if ENGINE == "pouchdb" else b"beam.smp"
        assert any(server in a for a in argv), argv
        assert process.poll() is None
        admin = Server(
            config.store.url,
            config.store.admin_user,
            config.store.admin_password,
            Settings(retries=0),
        )
        assert admin.is_admin()  # the helper made the configured admin
        assert local_store(config).status().pid == process.pid
        second = subprocess.run(
            [str(ASO), "--config", str(config_file), "store", "start", "--foreground"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert second.returncode == 1 and "already runs" in second.stderr
    finally:
        output = stop(process)
    assert process.returncode in (0, -signal.SIGTERM), output
    assert not local_store(config).status().answering


@only_on("pouchdb", "a CouchDB node's admin is written from the config at every start")
def test_foreground_store_stops_when_the_admin_is_not_its_admin(tmp_path: Path) -> None:
    config = make_config(tmp_path, free_port())
    EmbeddedStore(config).start()  # a store whose admin is this config's
    EmbeddedStore(config).stop()
    config.store.admin_password = "another-" + config.store.admin_password
    process = foreground(write_config(config))
    try:
        process.wait(timeout=120)  # the helper stops the server: the process ends by itself
    finally:
        output = stop(process)
    assert process.returncode == -signal.SIGTERM, output  # the helper's SIGTERM, no crash
    assert "are not an admin of the store" in output, output
    assert not EmbeddedStore(config).status().answering
