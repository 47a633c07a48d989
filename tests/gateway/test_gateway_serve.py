"""What an operator meets running `agentclaims serve`, on real processes on loopback: Ctrl-C
(SIGINT) stops as SIGTERM does, a call the stop cuts off gets a JSON 503, bad flag values are
refused naming the flag, the banner and the advertised URL give the port bound (`--port 0`) and
bracket an IPv6 host, the banner is what docs/operations.md shows, and `--help` gives defaults."""

from __future__ import annotations

import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
from servers import start_gateway, stop, wait_healthy

from agentclaims.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
SERVE = [sys.executable, "-m", "agentclaims.cli.main", "serve"]


def _banner(proc: subprocess.Popen[bytes], lines: int, timeout_s: float = 30) -> list[str]:
    """The first ``lines`` lines the gateway writes on stderr (bounded in time)."""
    assert proc.stderr is not None
    out = b""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stderr, selectors.EVENT_READ)
        while out.count(b"\n") < lines:
            left = deadline - time.monotonic()
            assert left > 0, f"no banner within {timeout_s} s: {out.decode()}"
            if sel.select(timeout=left):
                chunk = os.read(proc.stderr.fileno(), 4096)
                assert chunk, f"the gateway ended: {out.decode()}"
                out += chunk
    return out.decode().splitlines()[:lines]


def _stopped(proc: subprocess.Popen[bytes], sig: int) -> tuple[int, str]:
    """Send ``sig`` by PID; its exit status and everything it wrote on stderr."""
    os.kill(proc.pid, sig)
    try:
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            stop(proc)
    assert proc.stderr is not None
    return code, proc.stderr.read().decode()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_stops_as_sigterm_does(sig: int, tmp_path: Path) -> None:
    """SIGINT at its default (a terminal's Ctrl-C): exit 0, the ledger flushed, no traceback."""
    proc, url = start_gateway("--ledger", str(tmp_path / "ledger.sqlite"))
    assert httpx2.get(f"{url}/health", timeout=5).status_code == 200
    code, stderr = _stopped(proc, sig)
    assert code == 0, stderr
    assert f"signal {int(sig)}: stopping" in stderr
    assert stderr.rstrip().endswith("agentclaims gateway: stopped; ledger flushed"), stderr
    assert "Traceback" not in stderr, stderr
    assert "KeyboardInterrupt" not in stderr, stderr


def _calls(url: str) -> dict[str, int]:
    calls: dict[str, int] = httpx2.get(f"{url}/v1/stats", timeout=5).json()["gateway"]["calls"]
    return calls


def test_a_call_the_stop_cuts_off_gets_a_json_503(tmp_path: Path) -> None:
    """--grace-s runs out with a call in flight: it gets 503 `unavailable` as JSON, the stop
    logs no traceback and exits 0."""
    proc, url = start_gateway("--decode-ms", "300", "--grace-s", "1")
    answer: dict[str, Any] = {}

    def call() -> None:
        words = " ".join(f"word{i}" for i in range(12))
        answer["r"] = httpx2.post(
            f"{url}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": words}]},
            timeout=30,
        )

    thread = threading.Thread(target=call)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not _calls(url).get("POST /v1/chat/completions"):  # the call has come in
            assert time.monotonic() < deadline, "the call did not reach the gateway"
            time.sleep(0.05)
        time.sleep(0.5)  # it is being served (seconds of modelled decode)
        code, stderr = _stopped(proc, signal.SIGTERM)
    finally:
        thread.join(timeout=30)
    r = answer["r"]
    assert r.status_code == 503, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["type"] == "unavailable"
    assert "before this call finished" in r.json()["error"]["message"]  # cut off, not refused
    assert code == 0, stderr
    assert "Traceback" not in stderr, stderr
    assert "Exception in ASGI application" not in stderr, stderr
    assert stderr.rstrip().endswith("agentclaims gateway: stopped"), stderr


ON_VLLM = ["--kv", "vllm", "--upstream", "http://127.0.0.1:9", "--claims-key", "k"]
"""Where ``--promote`` and ``--promote-share`` are read (refused on the reference engine)."""


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--block-size", "0"], "--block-size: must be a positive integer, got 0"),
        (["--keep-alive-s", "-1"], "--keep-alive-s: must be a non-negative number"),
        (["--blocks", "99999999999"], "--blocks: must be within 1..10,000,000, got 99999999999"),
        (["--blocks", "0"], "--blocks: must be within 1..10,000,000, got 0"),
        ([*ON_VLLM, "--promote-share", "5"], "--promote-share: must be a number in (0, 1], got 5"),
        (["--decode-ms", "-1"], "--decode-ms: must be a non-negative number of ms, got -1"),
        (["--grace-s", "-1"], "--grace-s: must be a non-negative number of seconds, got -1"),
        (["--port", "70000"], "--port: must be within 0..65535, got 70000"),
        ([*ON_VLLM, "--promote", "-1"], "--promote: must be a non-negative integer, got -1"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_a_bad_flag_value_is_refused_naming_the_flag(args: list[str], says: str) -> None:
    done = subprocess.run(
        [*SERVE, "--host", "127.0.0.1", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=60,  # a value taken silently serves: the run times out and is killed
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"agentclaims serve: {says}"), done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr  # that line alone: no traceback


def test_a_port_in_use_is_refused_naming_the_port() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [*SERVE, "--host", "127.0.0.1", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"agentclaims serve: --port: cannot listen on 127.0.0.1:{port}")


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.parametrize(
    ("host", "netloc"),
    [
        ("127.0.0.1", "127.0.0.1:{port}"),
        pytest.param(
            "::1",
            "[::1]:{port}",
            marks=pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here"),
        ),
    ],
)
def test_port_0_and_ipv6_give_the_url_clients_reach(host: str, netloc: str) -> None:
    """`--port 0`: the banner and the advertised instance URL give the port bound, and an
    IPv6 host is in brackets; the URL printed is the one that answers."""
    proc = subprocess.Popen(
        [*SERVE, "--host", host, "--port", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        banner = _banner(proc, 4)
        found = re.search(r", http://(\S+)/v1$", banner[0])
        assert found, banner
        port = int(found.group(1).rsplit(":", 1)[1])
        assert port != 0
        where = netloc.format(port=port)
        assert found.group(1) == where, banner
        assert banner[3] == f"agentclaims gateway: instance {where} (http://{where})", banner
        url = f"http://{where}"
        wait_healthy(url)
        r = httpx2.get(f"{url}/health", timeout=5)
        assert r.headers["x-agentclaims-instance-url"] == url
        assert r.headers["x-agentclaims-instance"] == where
    finally:
        stop(proc)


def test_a_client_that_calls_as_the_banner_names_the_port_is_answered() -> None:
    """The port the banner names takes connections from then on (they wait while the app
    starts): a client that calls at once is answered, never refused, and needs no retry."""
    proc = subprocess.Popen(
        [*SERVE, "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        found = re.search(r", http://127.0.0.1:(\d+)/v1$", _banner(proc, 1)[0])
        assert found
        port = int(found.group(1))
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:  # no retry
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := conn.recv(4096):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    finally:
        stop(proc)


def test_the_banner_is_the_one_the_operations_page_shows(tmp_path: Path) -> None:
    """docs/operations.md's start-up banner, line for line (its paths and port put back)."""
    doc = (ROOT / "docs" / "operations.md").read_text()
    block = doc.split("At start it says on stderr", 1)[1].split("```text\n", 1)[1]
    shown = block.split("```", 1)[0].splitlines()
    keys = tmp_path / "keys.toml"
    keys.write_text(
        "".join(f'[[key]]\nkey = "ak-{t}-0123456789abcdef"\ntenant = "{t}"\n' for t in "abc")
    )
    ledger = tmp_path / "ledger.sqlite"
    proc, url = start_gateway("--api-keys", str(keys), "--ledger", str(ledger))
    try:
        printed = _banner(proc, 4)
    finally:
        stop(proc)
    port = url.rsplit(":", 1)[1]
    put_back = [
        line.replace(str(keys), "/etc/agentclaims/keys.toml")
        .replace(str(ledger), "/var/lib/agentclaims/ledger.sqlite")
        .replace(f":{port}", ":8099")
        for line in printed
    ]
    assert put_back == shown


def test_serve_help_gives_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["serve", "--help"])
    assert done.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    for flag, default in [
        ("--host", "127.0.0.1"),
        ("--port", "8099"),
        ("--blocks", "4096"),
        ("--grace-s", "30"),
        ("--keep-alive-s", "75"),
    ]:
        shown = help_text.split(f" {flag} ", 1)[1].split(" --", 1)[0]
        assert f"(default {default}" in shown, (flag, shown)
