"""The job's half of a stage-out: its output written at the source site, under the user's own
temporary area, with the user's own credential (`aso upload --write`; docs/usage.md, "Writing
the output"). The sites authorise the write by that credential (docs/security.md, "The files at
the embedded sites"); ASO's agents never write a user's temporary file."""

from __future__ import annotations

import os
from pathlib import Path

from aso import gfal2client, sites
from aso.config import Config
from aso.grid import gridenv


class StageOutError(ValueError):
    """The output could not be written; the message says why (the site's words)."""


def _use_credential(config: Config) -> None:
    """The user's credential as gfal2 and XrdSecgsi read it: the one `aso upload` shows the
    front end (store.x509_*, else the environment's, as grid tools find it)."""
    store = config.store
    found = gridenv.client_credential(
        str(config.path(store.x509_proxy)) if store.x509_proxy else "",
        str(config.path(store.x509_cert)) if store.x509_cert else "",
        str(config.path(store.x509_key)) if store.x509_key else "",
    )
    for name in ("X509_USER_PROXY", "X509_USER_CERT", "X509_USER_KEY"):
        os.environ.pop(name, None)
    if isinstance(found, str):
        os.environ["X509_USER_PROXY"] = found
    else:
        os.environ["X509_USER_CERT"], os.environ["X509_USER_KEY"] = found


def write_output(config: Config, local: Path, site: str, lfn: str, adler32: str) -> str:
    """Copy `local` to `lfn` at `site` (parents made, a job retry's earlier copy replaced, the
    adler32 compared at both ends); the PFN written."""
    try:
        _use_credential(config)
    except gridenv.CredentialError as error:
        raise StageOutError(str(error)) from None
    url = sites.pfn(config, site, lfn)
    gfal2 = gfal2client.import_gfal2(config, agent=False)
    ctx = gfal2client.new_context(config, allow_streaming=True, agent=False)
    params = gfal2client.transfer_parameters(ctx, overwrite=True, adler32=adler32)
    try:
        ctx.filecopy(params, f"file://{local.resolve()}", url)
    except gfal2.GError as error:
        raise StageOutError(f"writing {url}: [{error.code}] {error.message}") from None
    return url
