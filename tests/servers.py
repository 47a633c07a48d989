"""Real servers on loopback for the tests: `agentclaims serve` as a process (stopped by PID),
and an ASGI app under uvicorn in a thread. Every wait is bounded."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_healthy(url: str, alive: Any = None, timeout_s: float = 20.0) -> None:
    """Poll ``url/health`` until it answers 200 (bounded: a real server's readiness is the one
    thing a test must wait for)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if alive is not None:
            alive()
        try:
            if httpx2.get(f"{url}/health", timeout=0.5).status_code == 200:
                return
        except httpx2.TransportError:
            pass
        assert time.monotonic() < deadline, f"{url} did not become healthy within {timeout_s} s"
        time.sleep(0.05)


def start_gateway(*args: str) -> tuple[subprocess.Popen[bytes], str]:
    """`agentclaims serve ARGS` on a free loopback port, healthy; the process and its URL."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentclaims.cli.main",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"

    def alive() -> None:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""

    try:
        wait_healthy(url, alive)
    except BaseException:
        stop(proc)
        raise
    return proc, url


def stop(proc: subprocess.Popen[bytes], *, group: bool = False, timeout_s: float = 10) -> None:
    """SIGTERM (to its whole process group with ``group``: a server started in a session of
    its own, with children), then SIGKILL if it does not go within ``timeout_s``."""
    kill = os.killpg if group else os.kill
    if proc.poll() is None:
        kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout_s)
    if proc.stderr:
        proc.stderr.close()


@contextlib.contextmanager
def gateway_process(*args: str) -> Iterator[str]:
    """`agentclaims serve ARGS` on a free loopback port; yields its root URL."""
    proc, url = start_gateway(*args)
    try:
        yield url
    finally:
        stop(proc)


@contextlib.contextmanager
def app_in_thread(app: Any, *, keep_alive_s: int = 5) -> Iterator[str]:
    """``app`` under uvicorn on a free loopback port in a thread (idle connections closed
    after ``keep_alive_s``); yields its root URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            access_log=False,
            timeout_keep_alive=keep_alive_s,
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def start_router(*worker_urls: str) -> tuple[subprocess.Popen[bytes], str]:
    """The real vllm-router (``--policy sticky_least_loaded``) in front of ``worker_urls`` on
    a free loopback port, with fast health checks; the process (in a session of its own) and
    its URL. Stop it with ``stop(proc, group=True)``."""
    import shutil
    from pathlib import Path

    binary = shutil.which("vllm-router", path=str(Path(sys.executable).parent)) or "vllm-router"
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--worker-urls",
            *worker_urls,
            "--policy",
            "sticky_least_loaded",
            "--worker-startup-check-interval",
            "1",
            "--health-check-interval-secs",
            "1",
            "--health-failure-threshold",
            "1",
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(free_port()),
            "--log-level",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def alive() -> None:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""

    try:
        wait_healthy(url, alive, timeout_s=30)
    except BaseException:
        stop(proc, group=True)
        raise
    return proc, url
