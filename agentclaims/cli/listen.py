"""Where a command listens: the sockets bound for ``agentclaims serve`` before its app is
built (a port in use is refused naming the flag, ``--port 0`` prints the port it got), and the
same check for ``agentclaims vllm serve`` before vLLM starts."""

from __future__ import annotations

import errno
import socket

from agentclaims.errors import UsageError

__all__ = ["listen", "netloc"]


def netloc(host: str, port: int) -> str:
    """``host:port`` as a URL writes it: an IPv6 literal in brackets (``[::1]:8099``)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


_BACKLOG = 2048
"""uvicorn's own backlog: connections made before it accepts wait in it."""


def listen(host: str, port: int) -> list[socket.socket]:
    """Sockets bound on each address ``host`` names, as uvicorn (asyncio) would bind them, all
    on one port: ``port``, or for 0 the one the system picks (so the banner and the advertised
    URL say the port clients reach), and listening from then on: a connection made as soon as
    the banner names the port waits until the app takes it. An address of a family this system
    lacks is passed over."""
    try:
        infos = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise UsageError("--host", f"cannot listen on {host!r}: {exc.strerror}") from None
    sockets: list[socket.socket] = []
    failure: OSError | None = None
    for family, kind, proto, _, address in dict.fromkeys(infos):
        try:
            sock = socket.socket(family, kind, proto)
        except OSError as exc:  # a family this system lacks
            failure = failure or exc
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as asyncio's own: no IPv4 through an IPv6 socket
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if sockets:
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(_BACKLOG)  # a client that read the banner waits, never refused
        except OSError as exc:
            sock.close()
            failure = failure or exc
            if exc.errno == errno.EADDRNOTAVAIL:  # a family not enabled here (as asyncio's)
                continue
            for bound in sockets:
                bound.close()
            sockets = []
            break
        sockets.append(sock)
    if not sockets:
        assert failure is not None  # getaddrinfo gave at least one address
        flag = "--port" if failure.errno in (errno.EADDRINUSE, errno.EACCES) else "--host"
        where = netloc(host, port)
        raise UsageError(flag, f"cannot listen on {where}: {failure.strerror}")
    return sockets
