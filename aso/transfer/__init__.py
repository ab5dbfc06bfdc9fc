"""Transfer services behind one small interface (aso.transfer.base): gfal (embedded default),
fts3 (production) and sim (the simulator). `open_service(config)` picks the configured one."""

from __future__ import annotations

from aso.config import Config
from aso.store import Server
from aso.transfer.base import TransferService


def open_service(config: Config, server: Server | None = None) -> TransferService:
    """The transfer service of `transfer.backend`, as the agents use it."""
    backend = config.transfer.backend
    if backend == "fts3":
        from aso.transfer.fts3 import Fts3Service

        return Fts3Service(config)
    server = server or Server.from_config(config, account="agent")
    jobs_db = server.db(config.store.transfers_db)
    if backend == "sim":
        from aso.transfer.sim import SimService

        return SimService(jobs_db, config.sim)
    from aso.transfer.gfal import GfalService

    return GfalService(jobs_db)
