"""The connector's own channel: signed claim operations over a local socket, applied between
engine steps, for what cannot ride on an inference request.

A claim operation rides on a request to vLLM when one goes out (``kv_transfer_params``). Some
cannot wait for one: a release on an idle server, a renewal whose answer the caller needs now,
the connector's answer for a streamed request (vLLM sends no ``kv_transfer_params`` in a
stream), the events a harm judgement needs. This channel carries those without an engine
request: a Unix socket in the engine core's process, one JSON object per line each way.

- **Authenticated as the requests are**: every envelope is signed with the claims key and each
  nonce is accepted once (``signing``); the socket file is the owner's alone (mode 0600).
- **Bounded**: at most ``max_clients`` connections at once (one more is closed at once), a line
  of at most ``max_line`` bytes (a longer one ends the connection), and a connection idle for
  ``idle_s`` is closed.
- **True answers**: ``handle`` runs under the lock the scheduler holds through each of its
  steps (``ClaimsScheduler``), so an operation applies between two steps, never inside one, and
  what it answers is final.

Standard library only: tested without vLLM.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["OpsChannel", "call"]

Handler = Callable[[Mapping[str, Any]], dict[str, Any]]


class OpsChannel:
    """A Unix-socket server in a daemon thread; one thread per connection, bounded."""

    def __init__(
        self,
        path: str,
        handle: Handler,
        *,
        max_clients: int = 16,
        max_line: int = 1 << 20,
        idle_s: float = 300.0,
    ) -> None:
        self.path = path
        self._handle = handle
        self._slots = threading.BoundedSemaphore(max_clients)
        self._max_line = max_line
        self._idle_s = idle_s
        self._sock: socket.socket | None = None
        self._closed = threading.Event()
        self.served = 0
        """Envelopes answered (any outcome)."""

    def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # a stale socket of a process that died
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # the socket file is created 0600: the owner's alone
        try:
            sock.bind(self.path)
        finally:
            os.umask(old)
        sock.listen(64)
        self._sock = sock
        threading.Thread(target=self._accept, name="agentclaims-channel", daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def _accept(self) -> None:
        sock = self._sock
        while sock is not None and not self._closed.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return  # closed
            if not self._slots.acquire(blocking=False):
                conn.close()  # bounded: a connection past max_clients is refused at once
                continue
            threading.Thread(
                target=self._serve, args=(conn,), name="agentclaims-channel-conn", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(self._idle_s)
            reader = conn.makefile("rb")
            while not self._closed.is_set():
                line = reader.readline(self._max_line + 1)
                if not line or len(line) > self._max_line or not line.endswith(b"\n"):
                    return  # closed, or a line over the bound: the connection ends
                conn.sendall(self._answer(line))
        except OSError:
            return
        finally:
            conn.close()
            self._slots.release()

    def _answer(self, line: bytes) -> bytes:
        try:
            envelope = json.loads(line)
        except ValueError:
            answer: dict[str, Any] = {"ok": False, "reason": "not a JSON object"}
        else:
            if isinstance(envelope, dict):
                try:
                    answer = self._handle(envelope)
                except Exception as exc:  # the engine goes on; the caller hears why
                    answer = {"ok": False, "reason": f"{type(exc).__name__}: {exc}"[:500]}
            else:
                answer = {"ok": False, "reason": "not a JSON object"}
        self.served += 1
        return json.dumps(answer, separators=(",", ":")).encode() + b"\n"


def call(path: str, envelope: Mapping[str, Any], timeout_s: float = 10.0) -> dict[str, Any]:
    """One envelope's answer, on a connection of its own (tests, tools)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(path)
        sock.sendall(json.dumps(envelope).encode() + b"\n")
        reader = sock.makefile("rb")
        answer: dict[str, Any] = json.loads(reader.readline())
        return answer
