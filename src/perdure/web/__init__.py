"""The dashboard (``perdure ui``, the ``perdure[ui]`` extra): see, steer and answer running
agents in a browser, safely.

``dashboard(app)`` builds it over ``app``'s store; ``serve(...)`` runs it with uvicorn on a
socket bound before it returns or announces anything (``listen``), so a port in use is
one ``ConfigurationError`` at once, never a dashboard announced and then gone.
It listens on 127.0.0.1 unless told otherwise and refuses a non-loopback address
without a configured password; every request needs a session opened with a token
(issued on first start, printed once, stored hashed in the key folder) or a password;
viewers read, operators act. See docs/concepts/dashboard-security.md.

``api(app)`` is the HTTP API alone (``perdure api``; the dashboard serves it too, at
``/api/v1``): bearer tokens made with ``api_tokens(key_dir).create(...)`` (``perdure
api-token create``), scopes ``read``, ``operate`` and ``approve``, problem documents for
errors, and the OpenAPI document ``openapi()``. See docs/howto/http-api.md.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perdure.app import App
from perdure.errors import ConfigurationError
from perdure.web._auth import SCOPES, ApiToken, ApiTokens

if TYPE_CHECKING:
    from perdure.triggers import Triggers
    from perdure.web._api import Api

__all__ = ["SCOPES", "ApiToken", "ApiTokens", "api", "api_tokens", "check_api_bind",
           "check_bind", "dashboard", "is_loopback", "listen", "openapi", "openapi_text",
           "serve", "serve_in_thread"]


def _need_extra() -> None:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ConfigurationError(
            "the dashboard needs the ui extra: pip install 'perdure[ui]'") from None


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address or ``localhost``."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, *, password: bool) -> None:
    """Refuse (``ConfigurationError``) to listen on a non-loopback ``host`` unless a
    password is configured: a token printed to one console is not enough for a
    dashboard the network can reach."""
    if not is_loopback(host) and not password:
        raise ConfigurationError(
            f"refusing to serve the dashboard on {host}, which is not a loopback address, "
            "without a password: set PERDURE_UI_PASSWORD (operator) and put it behind TLS, "
            "or serve on 127.0.0.1")


def check_api_bind(host: str, *, tls: bool) -> None:
    """Refuse (``ConfigurationError``) to serve the API alone on a non-loopback ``host``
    without TLS (its own certificate, or a TLS proxy in front: ``tls``): a bearer token
    would cross the network in clear."""
    if not is_loopback(host) and not tls:
        raise ConfigurationError(
            f"refusing to serve the API on {host}, which is not a loopback address, over "
            "plain http: bearer tokens would cross the network in clear; give --tls-cert "
            "and --tls-key, or --https behind a TLS proxy, or serve on 127.0.0.1")


def api_tokens(key_dir: str | Path) -> ApiTokens:
    """The API tokens kept in ``key_dir`` (``create``, ``list``, ``revoke``)."""
    return ApiTokens(Path(key_dir))


def api(app: App, *, max_wait: float = 60.0, keepalive: float = 15.0,
        max_open: int = 256, triggers: Triggers | None = None) -> Api:
    """The HTTP API over ``app``'s store, as an ASGI application (serve it with
    ``serve``); its tokens are those of ``app``'s key folder. ``max_wait`` bounds a
    result's long poll (seconds), ``keepalive`` is how often an idle event stream says
    it is alive, ``max_open`` how many long polls and streams may be open at once.
    ``triggers`` holds the webhooks it serves at ``/api/v1/hooks/<name>`` (default:
    ``Triggers.of(app)``)."""
    _need_extra()
    from perdure.web._api import Api, ApiSettings

    settings = ApiSettings(max_wait=max_wait, keepalive=keepalive, max_open=max_open)
    return Api(app, ApiTokens(app.identity.folder.path), settings, triggers=triggers)


def openapi() -> dict[str, Any]:
    """The HTTP API's OpenAPI 3.1 document (what ``/api/v1/openapi.json`` serves)."""
    from perdure.web._openapi import document

    return document()


def openapi_text() -> str:
    """The OpenAPI document as ``docs/reference/openapi.json`` holds it."""
    from perdure.web._openapi import document_text

    return document_text()


def dashboard(app: App, *, passwords: Mapping[str, str] | None = None,
              host: str = "127.0.0.1", port: int = 8377,
              allowed_hosts: tuple[str, ...] = (), https: bool = False,
              new_tokens: bool = False, triggers: Triggers | None = None,
              ) -> tuple[object, dict[str, str]]:
    """The dashboard over ``app``'s store, as ``(asgi_app, tokens)``: ``tokens`` holds the
    tokens issued now (print them once; ``{}`` when the key folder had them already).
    ``passwords`` maps roles (``operator``, ``viewer``) to passwords; ``triggers`` the
    webhooks its API serves (default: ``Triggers.of(app)``)."""
    _need_extra()
    from perdure.web._api import Api
    from perdure.web._auth import Credentials
    from perdure.web._server import Dashboard, UiSettings

    check_bind(host, password=bool(passwords))
    credentials = Credentials(app.identity.folder.path, passwords=dict(passwords or {}))
    tokens = credentials.ensure_tokens(reissue=new_tokens)
    settings = UiSettings(host=host, port=port, allowed_hosts=tuple(allowed_hosts),
                          https=https)
    served = Api(app, ApiTokens(app.identity.folder.path), triggers=triggers)
    return Dashboard(app, credentials, settings, api=served).asgi(), tokens


def listen(host: str, port: int, *, what: str = "the dashboard") -> socket.socket:
    """A socket bound to ``host:port`` and listening; ``ConfigurationError`` (saying what
    to do) when the address is taken or cannot be used. ``what`` names the server in the
    message (``"the API"``)."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise ConfigurationError(f"cannot serve {what} on {where}: {exc.strerror}; "
                                 "check --host") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigurationError(
                f"cannot serve {what} on {where}: the port is in use (another "
                f"{what.removeprefix('the ')}?); stop that program or pick another port"
            ) from None
        raise ConfigurationError(f"cannot serve {what} on {where}: "
                                 f"{exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def _uvicorn_server(asgi: object, *, host: str, port: int, ssl_certfile: str | None,
            ssl_keyfile: str | None) -> object:
    import uvicorn

    config = uvicorn.Config(asgi, host=host, port=port, log_level="warning",  # type: ignore[arg-type]
                            ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile,
                            server_header=False, proxy_headers=False)
    return uvicorn.Server(config)


def serve(asgi: object, *, host: str, port: int, ssl_certfile: str | None = None,
          ssl_keyfile: str | None = None, sock: socket.socket | None = None) -> None:
    """Run ``asgi`` with uvicorn on ``sock`` (bound now with ``listen`` when not given)
    until interrupted. Blocks."""
    sock = sock or listen(host, port)
    server = _uvicorn_server(asgi, host=host, port=port, ssl_certfile=ssl_certfile,
                     ssl_keyfile=ssl_keyfile)
    try:
        server.run(sockets=[sock])  # type: ignore[attr-defined]
    finally:
        sock.close()


def serve_in_thread(asgi: object, *, host: str, port: int, ssl_certfile: str | None = None,
                    ssl_keyfile: str | None = None, sock: socket.socket | None = None,
                    ) -> tuple[threading.Thread, object]:
    """Run ``asgi`` with uvicorn in a daemon thread (``perdure worker --ui``, tests), on
    ``sock`` (bound now, in the caller, when not given: a port in use raises here);
    returns the thread and the uvicorn server (set its ``should_exit`` to stop it)."""
    sock = sock or listen(host, port)
    server = _uvicorn_server(asgi, host=host, port=port, ssl_certfile=ssl_certfile,
                     ssl_keyfile=ssl_keyfile)
    listening = sock

    def run() -> None:
        try:
            server.run(sockets=[listening])  # type: ignore[attr-defined]
        finally:
            listening.close()

    thread = threading.Thread(target=run, daemon=True, name="perdure-ui")
    thread.start()
    return thread, server
