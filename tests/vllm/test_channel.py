"""The connector's channel (``agentclaims_vllm.channel``) on a real Unix socket, without vLLM:
one JSON answer per line, its bounds (line length, connections), a handler's error answered,
not fatal, and the socket file the owner's alone."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from agentclaims_vllm.channel import OpsChannel, call


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a path short enough for a Unix socket (108 bytes at most)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ac-", dir="/tmp") as d:
        yield Path(d)


def _echo(envelope: Mapping[str, Any]) -> dict[str, Any]:
    if envelope.get("boom"):
        raise RuntimeError("the handler failed")
    return {"ok": True, "ops": envelope.get("ops")}


def test_each_line_gets_its_answer_on_one_connection(short_dir: Path) -> None:
    channel = OpsChannel(str(short_dir / "c.sock"), _echo)
    channel.start()
    try:
        mode = stat.S_IMODE(os.stat(channel.path).st_mode)
        assert mode & 0o077 == 0, oct(mode)  # the owner's alone
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(channel.path)
            reader = sock.makefile("rb")
            for n in range(3):
                sock.sendall(json.dumps({"ops": [n]}).encode() + b"\n")
                assert json.loads(reader.readline()) == {"ok": True, "ops": [n]}
            sock.sendall(b"not json\n")
            assert json.loads(reader.readline()) == {"ok": False, "reason": "not a JSON object"}
            sock.sendall(b"[1, 2]\n")
            assert json.loads(reader.readline())["ok"] is False
        answer = call(channel.path, {"boom": True})
        assert answer == {"ok": False, "reason": "RuntimeError: the handler failed"}
        assert call(channel.path, {"ops": ["after"]}) == {"ok": True, "ops": ["after"]}
        assert channel.served == 7
    finally:
        channel.close()
    assert not os.path.exists(channel.path)


def test_a_line_over_the_bound_ends_the_connection_and_nothing_else(short_dir: Path) -> None:
    seen: list[Mapping[str, Any]] = []

    def handle(envelope: Mapping[str, Any]) -> dict[str, Any]:
        seen.append(envelope)
        return {"ok": True}

    channel = OpsChannel(str(short_dir / "c.sock"), handle, max_line=64)
    channel.start()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(channel.path)
            sock.sendall(json.dumps({"pad": "x" * 200}).encode() + b"\n")
            assert sock.makefile("rb").readline() == b""  # closed, unanswered
        assert seen == []
        assert call(channel.path, {"small": 1}) == {"ok": True}
    finally:
        channel.close()


def test_connections_past_the_bound_are_closed_at_once(short_dir: Path) -> None:
    release = threading.Event()

    def slow(envelope: Mapping[str, Any]) -> dict[str, Any]:
        release.wait(10)
        return {"ok": True}

    channel = OpsChannel(str(short_dir / "c.sock"), slow, max_clients=2)
    channel.start()
    held = []
    try:
        for _ in range(2):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(5)
            sock.connect(channel.path)
            sock.sendall(b"{}\n")
            held.append(sock)
        time.sleep(0.2)  # both are being served (blocked in the handler)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as extra:
            extra.settimeout(5)
            extra.connect(channel.path)
            assert extra.makefile("rb").readline() == b""  # refused: closed unanswered
        release.set()
        for sock in held:
            assert json.loads(sock.makefile("rb").readline()) == {"ok": True}
    finally:
        for sock in held:
            sock.close()
        channel.close()


def test_a_stale_socket_file_is_replaced(short_dir: Path) -> None:
    path = short_dir / "c.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # a process that died left its socket file
    channel = OpsChannel(str(path), _echo)
    channel.start()
    try:
        assert call(str(path), {"ops": []}) == {"ok": True, "ops": []}
    finally:
        channel.close()
