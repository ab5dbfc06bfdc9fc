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
    from aso.frontend import server as frontend  # Twisted only where it is used
    from aso.frontend.server import MapfileError

    config = _config(ctx)
    try:
        frontend.serve(config)
    except (OSError, MapfileError, ValueError) as error:
        print(f"aso frontend: {error}", file=sys.stderr)
        raise typer.Exit(1) from None


@certs_app.command("demo")
def certs_demo(
    ctx: typer.Context,
    directory: Annotated[Path, typer.Argument(help="Where to write them (created).")] = Path(
        "certs"
    ),
    user: Annotated[
        list[str] | None, typer.Option("--user", help="A user (repeatable); default alice, bob.")
    ] = None,
) -> None:
    """A throw-away CA with its grid CA directory and CRL, a host certificate for 127.0.0.1,
    certificates, keys and RFC 3820 proxies for users, the agents (aso-agent-host) and an operator
    (aso-operator, role aso-admin), and a grid-mapfile mapping their DNs; for each user a
    PKCS#12 file for a browser, <user>.p12, with its generated password in <user>.p12.password.
    Prints the paths, then how to open the monitoring pages in a browser with them."""
    from aso.local import pki

    users = user or ["alice", "bob"]
    paths = pki.demo(directory, users)
    width = max(len(k) for k in paths)
    for name, path in paths.items():
        print(f"{name:<{width}}  {path}")
    print()
    for line in browser_steps(paths, users, _frontend_port(ctx)):
        print(line)


@certs_app.command("proxy")
def certs_proxy(
    who: Annotated[str, typer.Argument(help="Whose: the name `aso certs demo` gave the files.")],
    directory: Annotated[
        Path, typer.Option("--dir", help="Where `aso certs demo` wrote them.")
    ] = Path("certs"),
    hours: Annotated[float, typer.Option("--hours", min=0.1, max=168)] = 12.0,
) -> None:
    """A fresh RFC 3820 proxy, DIR/x509up_WHO, from WHO's certificate and key in DIR (what
    voms-proxy-init does, without VOMS): a demo proxy lasts 12 hours."""
    import datetime as dt

    from aso.local import pki

    cert, key = directory / f"{who}-cert.pem", directory / f"{who}-key.pem"
    if not (cert.is_file() and key.is_file()):
        print(f"aso certs proxy: no {cert} and {key}: run `aso certs demo {directory}`",
              file=sys.stderr)  # fmt: skip
        raise typer.Exit(2)
    proxy = pki.renew_proxy(cert, key, directory / f"x509up_{who}", dt.timedelta(hours=hours))
    print(f"{proxy} (valid {hours:g} hours)")


def _frontend_port(ctx: typer.Context) -> str:
    """The port of `frontend.listen` in the config, if one is found and loads; else the
    default's (the certificates need no config)."""
    from aso.config import Config, ConfigError

    try:
        listen = _config(ctx).frontend.listen
    except (ConfigError, OSError):
        listen = Config().frontend.listen
    return listen.rpartition(":")[2]


def browser_steps(paths: dict[str, Path], users: list[str], port: str) -> list[str]:
    """How to open the monitoring pages in a browser with `aso certs demo`'s files (absolute
    paths: a browser's file dialog does not start in the shell's directory)."""
    width = max(len(str(paths[f"{u}.p12"].resolve())) for u in users)
    return [
        "To open the monitoring pages in a browser:",
        "  1. Import a user's certificate, with the password in the file next to it:",
        *(
            f"       {paths[f'{u}.p12'].resolve()!s:<{width}}  "
            f"(password: {paths[f'{u}.p12.password'].resolve()})"
            for u in users
        ),
        "     Chromium: Settings → Privacy and security → Security → Manage certificates → "
        "Your certificates → Import",
        "     Firefox: Settings → Privacy & Security → Certificates → View Certificates → "
        "Your Certificates → Import",
        f"  2. Import the demo CA, {paths['ca'].resolve()}, as an authority for websites:",
        "     Chromium: Manage certificates → Authorities → Import, tick "
        '"Trust this certificate for identifying websites"',
        "     Firefox: View Certificates → Authorities → Import, tick "
        '"Trust this CA to identify websites"',
        "  3. Open the monitoring pages' address that `aso run` prints "
        f"(https://127.0.0.1:{port}/...) and choose the certificate when the browser asks.",
    ]
