"""What every `aso` sub-command module shares: the configuration of the invocation. Its own
module so that aso/cli/__init__.py and the modules it mounts (catalog, storage, ...) import it
without importing each other."""

from __future__ import annotations

import datetime as dt
import logging
import sys
from typing import cast

import typer

from aso import config as aso_config
from aso.config import Config


def config_of(ctx: typer.Context) -> Config:
    """The configuration, loaded on first use (so that `aso config init` needs none)."""
    obj = ctx.find_root().obj
    if "config" not in obj:
        config = aso_config.load(obj["config_file"])
        level = "DEBUG" if obj["verbose"] else config.log.level.upper()
        logging.basicConfig(
            level=getattr(logging, level),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
        )
        if not obj["verbose"]:
            # The HTTP stack's own retry warnings would repeat what our one-line errors say.
            logging.getLogger("urllib3").setLevel(logging.ERROR)
            logging.getLogger("ibm_cloud_sdk_core").setLevel(logging.ERROR)
            # gfal2 passes its plugins' protocol traces (every Davix request and answer) at
            # INFO: ~160 lines a copy drowned the worker's one line per file.
            logging.getLogger("gfal2").setLevel(logging.WARNING)
        obj["config"] = config
    return cast(Config, obj["config"])


def utc_time(epoch: float | None) -> str:
    """An epoch time as `YYYY-MM-DD HH:MM:SS` (UTC); empty when unknown."""
    if not epoch:
        return ""
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
