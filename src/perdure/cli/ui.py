"""``perdure ui``: serve the dashboard over the store (and ``perdure worker --ui``)."""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

import click

from perdure.app import App
from perdure.errors import ConfigurationError
from perdure.triggers import Triggers

__all__ = ["start_ui", "ui", "ui_options"]


def _fail(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


def _passwords() -> dict[str, str]:
    found = {}
    for role, var in (("operator", "PERDURE_UI_PASSWORD"),
                      ("viewer", "PERDURE_UI_VIEWER_PASSWORD")):
        value = os.environ.get(var)
        if value:
            found[role] = value
    return found


def start_ui(app: App, *, host: str, port: int, allowed_hosts: tuple[str, ...] = (),
             tls_cert: str | None = None, tls_key: str | None = None,
             new_tokens: bool = False, background: bool = False, https: bool = False,
             triggers: Triggers | None = None) -> Any:
    """Build the dashboard over ``app`` and serve it (in a thread with ``background``);
    prints where, and the tokens issued now, once. Fails with one CLI line on a bad
    setting."""
    from perdure import web

    if (tls_cert is None) != (tls_key is None):
        _fail("--tls-cert and --tls-key go together")
    # The CLI opens nothing it prints; the dashboard opens what a person must read to
    # answer (questions' prompts and choices), with this node's data keys.
    app.open_sealed = True
    try:
        web.check_bind(host, password=bool(_passwords()))
        # Bound before anything is announced or a token issued: a port in use is one
        # line now, not a dashboard announced and gone, nor tokens never shown.
        sock = web.listen(host, port)
    except ConfigurationError as exc:
        _fail(str(exc))
    try:
        asgi, tokens = web.dashboard(app, passwords=_passwords(), host=host, port=port,
                                     allowed_hosts=allowed_hosts,
                                     https=https or tls_cert is not None,
                                     new_tokens=new_tokens, triggers=triggers)
    except ConfigurationError as exc:
        sock.close()
        _fail(str(exc))
    scheme = "https" if tls_cert or https else "http"
    where = f"[{host}]" if ":" in host else host
    click.echo(f"dashboard on {scheme}://{where}:{port}/ over {app.store_url}", err=True)
    if tokens:
        click.echo("dashboard tokens, shown this once (only their hashes are kept, in "
                   f"{app.identity.folder.path}/ui-auth.json):", err=True)
        for role, token in tokens.items():
            click.echo(f"  {role}: {token}", err=True)
    if background:
        return web.serve_in_thread(asgi, host=host, port=port, ssl_certfile=tls_cert,
                                   ssl_keyfile=tls_key, sock=sock)
    web.serve(asgi, host=host, port=port, ssl_certfile=tls_cert, ssl_keyfile=tls_key,
              sock=sock)
    return None


def ui_options(fn: Any) -> Any:
    """The dashboard's listening options, shared by ``ui`` and ``worker --ui``."""
    for option in reversed([
        click.option("--host", "ui_host", default="127.0.0.1", show_default=True,
                     envvar="PERDURE_UI_HOST", help="Address the dashboard listens on; "
                     "another than loopback needs PERDURE_UI_PASSWORD."),
        click.option("--port", "ui_port", default=8377, show_default=True,
                     type=click.IntRange(1, 65535),
                     envvar="PERDURE_UI_PORT", help="Port the dashboard listens on."),
        click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
                     help="A Host name the dashboard answers to besides its own (repeatable)."),
        click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False),
                     help="Serve https with this certificate (PEM); cookies become Secure."),
        click.option("--tls-key", type=click.Path(exists=True, dir_okay=False),
                     help="The certificate's private key (PEM)."),
    ]):
        fn = option(fn)
    return fn


@click.command()
@ui_options
@click.option("--https", is_flag=True,
              help="Browsers reach the dashboard over https through a TLS proxy: cookies "
                   "are Secure and the Origin checked is https.")
@click.option("--new-tokens", is_flag=True,
              help="Issue new operator and viewer tokens (the old ones stop working).")
@click.pass_obj
def ui(obj: Any, ui_host: str, ui_port: int, allowed_hosts: tuple[str, ...],
       tls_cert: str | None, tls_key: str | None, https: bool, new_tokens: bool) -> None:
    """Serve the dashboard over the store: objects, memory, inbox, nodes, charts.

    Listens on 127.0.0.1:8377 by default. The first start issues an operator and a viewer
    token, printed once; PERDURE_UI_PASSWORD / PERDURE_UI_VIEWER_PASSWORD set passwords.
    """
    app = obj.app()
    start_ui(app, host=ui_host, port=ui_port, allowed_hosts=allowed_hosts,
             tls_cert=tls_cert, tls_key=tls_key, new_tokens=new_tokens, https=https,
             triggers=Triggers.of(obj.loaded() or app))
