"""`aso frontend` (the X.509 front end, aso.frontend) and `aso certs demo` (a throw-away grid
PKI, aso.local.pki). aso/cli/__init__.py registers both."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from aso.cli.common import config_of as _config

certs_app = typer.Typer(help="Certificates for demos and tests.", no_args_is_help=True)


def frontend_cmd(ctx: typer.Context) -> None:
    """Run the X.509 front end (HTTPS, client certificates and proxies) in the foreground."""
    from aso import frontend  # Twisted only where it is used
    from aso.frontend import MapfileError

    config = _config(ctx)
    try:
        frontend.serve(config)
    except (OSError, MapfileError, ValueError) as error:
        print(f"aso frontend: {error}", file=sys.stderr)
        raise typer.Exit(1) from None


@certs_app.command("demo")
def certs_demo(
    directory: Annotated[Path, typer.Argument(help="Where to write them (created).")] = Path(
        "certs"
    ),
    user: Annotated[
        list[str] | None, typer.Option("--user", help="A user (repeatable); default alice, bob.")
    ] = None,
) -> None:
    """A throw-away CA with its grid CA directory and CRL, a host certificate for 127.0.0.1,
    certificates, keys and RFC 3820 proxies for users, the agents (aso-agent-host) and an operator
    (aso-operator, role aso-admin), and a grid-mapfile mapping their DNs."""
    from aso.local import pki

    paths = pki.demo(directory, user or ["alice", "bob"])
    width = max(len(k) for k in paths)
    for name, path in paths.items():
        print(f"{name:<{width}}  {path}")
