"""``perdure api``: serve the HTTP API over the store; ``perdure api-token``: its tokens."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

import click

from perdure.app import App
from perdure.errors import ConfigurationError
from perdure.triggers import Triggers

__all__ = ["api", "api_token"]

DEFAULT_PORT = 8378


def _fail(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


def _when(ts: float | None) -> str:
    return "never" if ts is None else datetime.fromtimestamp(ts).isoformat(" ", "seconds")


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, envvar="PERDURE_API_HOST",
              help="Address the API listens on; another than loopback needs TLS "
                   "(--tls-cert/--tls-key, or --https behind a TLS proxy).")
@click.option("--port", default=DEFAULT_PORT, show_default=True,
              type=click.IntRange(1, 65535), envvar="PERDURE_API_PORT",
              help="Port the API listens on.")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False),
              help="Serve https with this certificate (PEM).")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False),
              help="The certificate's private key (PEM).")
@click.option("--https", is_flag=True,
              help="Callers reach the API over https through a TLS proxy in front of it.")
@click.option("--write-openapi", "write_openapi", metavar="FILE",
              help="Write the API's OpenAPI document to FILE ('-': stdout) and exit.")
@click.pass_obj
def api(obj: Any, host: str, port: int, tls_cert: str | None, tls_key: str | None,
        https: bool, write_openapi: str | None) -> None:
    """Serve the HTTP API over the store at /api/v1 (see docs/howto/http-api.md).

    Every request needs a bearer token (perdure api-token create NAME --scope SCOPE);
    starting objects needs your agents (--app). Listens on 127.0.0.1:8378 by default.
    The dashboard (perdure ui) serves the same API at /api/v1 too.
    """
    from perdure import web

    if write_openapi is not None:
        text = web.openapi_text()
        if write_openapi == "-":
            click.echo(text, nl=False)
        else:
            Path(write_openapi).write_text(text, encoding="utf-8")
            click.echo(f"wrote {write_openapi}", err=True)
        return
    if (tls_cert is None) != (tls_key is None):
        _fail("--tls-cert and --tls-key go together")
    try:
        web.check_api_bind(host, tls=https or tls_cert is not None)
    except ConfigurationError as exc:
        _fail(str(exc))
    app = obj.app()
    app.open_sealed = True  # callers read results and questions as Python callers do
    try:
        sock = web.listen(host, port, what="the API")
    except ConfigurationError as exc:
        _fail(str(exc))
    try:
        asgi = web.api(app, triggers=_declared(obj, app))
        tokens = web.api_tokens(app.identity.folder.path).list()
    except ConfigurationError as exc:
        sock.close()
        _fail(str(exc))
    scheme = "https" if tls_cert or https else "http"
    where = f"[{host}]" if ":" in host else host
    served = ", ".join(sorted(app.agents)) or "none (pass --app to start objects)"
    click.echo(f"API on {scheme}://{where}:{port}/api/v1 over {app.store_url} "
               f"(agents: {served})", err=True)
    if not tokens:
        click.echo("no API token yet: make one with `perdure api-token create NAME --scope "
                   "read --scope operate` (same --store / --key-dir)", err=True)
    web.serve(asgi, host=host, port=port, ssl_certfile=tls_cert, ssl_keyfile=tls_key,
              sock=sock)


def _declared(obj: Any, app: App) -> Triggers:
    """The triggers (webhooks among them) the ``--app`` App declared."""
    return Triggers.of(obj.loaded() or app)


@click.group(name="api-token")
def api_token() -> None:
    """Tokens of the HTTP API, kept hashed in the key folder (api-tokens.json)."""


def _tokens(obj: Any) -> Any:
    from perdure import web

    return web.api_tokens(obj.key_folder().path)


def _scopes(given: tuple[str, ...]) -> list[str]:
    return [part.strip() for item in given for part in item.split(",") if part.strip()]


@api_token.command()
@click.argument("name")
@click.option("--scope", "scopes", multiple=True, required=True, metavar="SCOPE",
              help="read, operate or approve (repeatable, or comma-separated).")
@click.option("--days", type=float, default=None,
              help="The token stops working after this many days (default: never).")
@click.option("--json", "as_json", is_flag=True, help="Print the token and its entry as JSON.")
@click.pass_obj
def create(obj: Any, name: str, scopes: tuple[str, ...], days: float | None,
           as_json: bool) -> None:
    """Make a token for NAME (who its actions are noted as); printed once."""
    tokens = _tokens(obj)
    token, kept = tokens.create(name, _scopes(scopes), days=days)
    if as_json:
        click.echo(json.dumps({"token": token, **kept.to_json()}, indent=2))
        return
    click.echo(f"token {kept.token_id} for {kept.name} (scopes {', '.join(kept.scopes)}, "
               f"expires {_when(kept.expires_at)}), shown this once; only its hash is kept, "
               f"in {tokens.path}:", err=True)
    click.echo(token)


@api_token.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.pass_obj
def list_(obj: Any, as_json: bool) -> None:
    """List the tokens (never their secrets)."""
    found = _tokens(obj).list()
    if as_json:
        click.echo(json.dumps([t.to_json() for t in found], indent=2))
        return
    if not found:
        click.echo("no API token")
        return
    for t in found:
        click.echo(f"{t.token_id}  {t.name}  {','.join(t.scopes)}  made {_when(t.created_at)}"
                   f"  expires {_when(t.expires_at)}")


@api_token.command()
@click.argument("token_id")
@click.pass_obj
def revoke(obj: Any, token_id: str) -> None:
    """Revoke the token TOKEN_ID: it stops working at its next request."""
    if not _tokens(obj).revoke(token_id):
        _fail(f"no API token {token_id!r} in {_tokens(obj).path}; see `perdure api-token list`")
    click.echo(f"revoked {token_id}")
