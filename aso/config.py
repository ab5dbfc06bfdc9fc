"""ASO's configuration: one TOML file, every key declared here with its default and meaning.

The file is found at `--config PATH`, else `$ASO_CONFIG`, else `./aso.toml`, else
`~/.config/aso/aso.toml`, else `/etc/aso/aso.toml`; with none of them ASO runs on the defaults
below. Relative paths in the file are relative to the directory holding the file (to the current
directory when there is no file). A key this module does not declare is an error, never ignored:
a misspelt key would otherwise silently fall back to its default.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import secrets
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

SEARCH_PATHS = (
    Path("aso.toml"),
    Path("~/.config/aso/aso.toml"),
    Path("/etc/aso/aso.toml"),
)


class ConfigError(Exception):
    """The configuration file cannot be used; the message says which key and why."""


def _key(default: Any, doc: str, *, secret: bool = False, path: bool = False) -> Any:
    return field(default=default, metadata={"doc": doc, "secret": secret, "path": path})


@dataclass
class StoreConfig:
    url: str = _key(
        "http://127.0.0.1:5984",
        "CouchDB-3-API URL of the document store: the embedded pouchdb-server or a real CouchDB 3.",
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
    files_db: str = _key("asynctransfer", "Database holding the transfer requests.")
    connect_timeout: float = _key(5.0, "Seconds to wait for a TCP connection to the store.")
    read_timeout: float = _key(
        120.0, "Seconds to wait for a store answer (view builds can be slow)."
    )
    retries: int = _key(5, "Retries of a request that met a connection error, 429 or 5xx.")
    backoff: float = _key(0.5, "First retry delay in seconds; doubles at each retry.")
    backoff_max: float = _key(30.0, "Longest delay between two retries, in seconds.")
    pool_size: int = _key(16, "HTTP connections kept open to the store per process.")
    feed_timeout: float = _key(
        30.0, "Seconds a `_changes` long poll may wait for a change before the client ends it."
    )


@dataclass
class EmbeddedConfig:
    data_dir: str = _key(
        "var/store", "Directory of the embedded store's data, pid file and log.", path=True
    )
    server: str = _key(
        "",
        "pouchdb-server executable; empty: deploy/store/node_modules/.bin/pouchdb-server of the"
        " checkout, then pouchdb-server on PATH.",
        path=True,
    )
    start_timeout: float = _key(30.0, "Seconds `aso store start` waits for the store to answer.")


@dataclass
class LogConfig:
    level: str = _key("INFO", "Log level: DEBUG, INFO, WARNING or ERROR.")


@dataclass
class Config:
    store: StoreConfig = field(default_factory=StoreConfig)
    embedded: EmbeddedConfig = field(default_factory=EmbeddedConfig)
    log: LogConfig = field(default_factory=LogConfig)
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
    """(name, section dataclass instance or class) for every section, in file order."""
    target = config or Config()
    return [
        (f.name, getattr(target, f.name))
        for f in dataclasses.fields(Config)
        if not f.metadata.get("internal")
    ]


def describe() -> list[tuple[str, Any, str]]:
    """(`section.key`, default, meaning) for every key: the source of the README's table."""
    rows = []
    for name, section in sections():
        for f in dataclasses.fields(section):
            rows.append((f"{name}.{f.name}", f.default, f.metadata["doc"]))
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


def from_dict(data: dict[str, Any], source: Path | None = None) -> Config:
    config = Config(source=source)
    label = str(source) if source else "config"
    known_sections = [name for name, _ in sections(config)]
    for section_name, values in data.items():
        if section_name not in known_sections:
            raise _unknown(label, section_name, known_sections)
        if not isinstance(values, dict):
            raise ConfigError(f"{label}: [{section_name}] must be a table")
        section = getattr(config, section_name)
        fields = {f.name: f for f in dataclasses.fields(section)}
        for key, value in values.items():
            where = f"{label}: {section_name}.{key}"
            if key not in fields:
                raise _unknown(
                    label, f"{section_name}.{key}", [f"{section_name}.{k}" for k in fields]
                )
            setattr(section, key, _check_type(where, value, type(fields[key].default)))
    _check_values(config, label)
    return config


def _check_values(config: Config, label: str) -> None:
    if not config.store.url.startswith(("http://", "https://")):
        raise ConfigError(f"{label}: store.url must be an http:// or https:// URL")
    if config.log.level.upper() not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        raise ConfigError(f"{label}: log.level must be DEBUG, INFO, WARNING or ERROR")
    for name in ("retries", "pool_size"):
        if getattr(config.store, name) < (0 if name == "retries" else 1):
            raise ConfigError(f"{label}: store.{name} is out of range")


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


def to_dict(config: Config, *, show_secrets: bool = False) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, section in sections(config):
        values = {}
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if f.metadata["secret"] and value and not show_secrets:
                value = "********"
            values[f.name] = value
        out[name] = values
    return out


def render(config: Config, *, show_secrets: bool = False) -> str:
    return tomli_w.dumps(to_dict(config, show_secrets=show_secrets))


def new_config_text() -> str:
    """A fresh config file: the defaults, with generated passwords for the store accounts."""
    config = Config()
    config.store.admin_password = secrets.token_urlsafe(18)
    config.store.agent_password = secrets.token_urlsafe(18)
    header = (
        "# ASO configuration, written by `aso config init`. Every key and its default is listed\n"
        "# in README.md (section Configuration); `aso config show` prints the effective values.\n"
    )
    return header + render(config, show_secrets=True)


def write_new_config(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # The file holds passwords: create it readable by its owner only.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(new_config_text())
