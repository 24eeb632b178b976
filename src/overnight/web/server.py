"""Run the dashboard: ``overnight ui`` (:func:`serve`), with the bind and token rules."""

from __future__ import annotations

import ipaddress
import secrets
import socket
from typing import Callable

from overnight.errors import ConfigError
from overnight.store.base import Store


def is_loopback(host: str) -> bool:
    """True for ``127.0.0.0/8``, ``::1`` and ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    """True for the "every interface" binds ``0.0.0.0``, ``::`` and the empty host."""
    return host.strip("[]") in ("0.0.0.0", "::", "")


def open_url(host: str, port: int, token: str | None = None) -> str:
    """The URL a browser on this machine opens for a server bound to ``host``: a wildcard bind
    (``0.0.0.0``, ``::``) is reached at ``127.0.0.1`` (``0.0.0.0`` is not an address to open);
    an IPv6 literal is bracketed; ``?token=`` is appended when there is one."""
    h = host.strip("[]")
    shown = "127.0.0.1" if is_wildcard(host) else f"[{h}]" if ":" in h else h
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")


def serve(store: Store | str | None = None, *, host: str = "127.0.0.1", port: int = 8765, read_only: bool = False,
          token: str | None = None, announce: Callable[[str], None] = print) -> None:
    """Serve the dashboard until Ctrl-C (uvicorn, one process).

    On a loopback ``host`` no token is needed (one may be given). Any other host requires one:
    without ``token`` a random one is generated and ``announce``-d once, in the URL to open.
    ``port=0`` picks a free port. The URL is announced before serving.

    Raises:
        ConfigError: the store does not exist, or the port is taken.
    """
    import uvicorn

    from overnight.web.app import create_app

    loopback = is_loopback(host)
    if not loopback and not token:
        token = secrets.token_urlsafe(18)
    app = create_app(store, read_only=read_only, token=token, loopback=loopback)
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}",
                          hint="pick another --port (0 picks a free one)") from exc
    port = sock.getsockname()[1]
    url = open_url(host, port, token)
    announce(f"overnight ui on {app.state.dashboard.store.url}" + (" (read-only)" if read_only else ""))
    announce(f"open {url}" + ("  (the token is needed on every request; it is printed only here)" if token else ""))
    if is_wildcard(host):
        announce(f"listening on every interface ({host}): from another machine use "
                 f"{open_url(socket.gethostname(), port, token)}")
    announce("stop with Ctrl-C")
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
