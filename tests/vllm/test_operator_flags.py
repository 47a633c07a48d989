"""An operator's slips on the vLLM commands are refused before anything runs: exit status 2,
one line naming the flag as it was typed, no traceback, nothing built, bound or started. The
real commands run here as processes; no vLLM is started."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from servers import free_port

from agentclaims.vllm import vllm_python


def _cli(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentclaims.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _refused(done: subprocess.CompletedProcess[str], prefix: str, says: str) -> None:
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith(f"{prefix}: {says}"), done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr  # that line alone: no traceback


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (("--hidden", "100"), "--hidden: must be a positive multiple of 64, got 100"),
        (("--hidden", "0"), "--hidden: must be a positive multiple of 64, got 0"),
        (("--layers", "0"), "--layers: must be a positive integer, got 0"),
    ],
    ids=" ".join,
)
def test_tiny_model_names_the_flag_it_cannot_build(
    options: tuple[str, ...], says: str, tmp_path: Path
) -> None:
    out = tmp_path / "m"
    done = _cli("vllm", "tiny-model", str(out), *options, "--python", vllm_python())
    _refused(done, "agentclaims vllm", says)
    assert not out.exists()


def test_tiny_model_into_a_file_is_refused_and_the_file_kept(tmp_path: Path) -> None:
    taken = tmp_path / "notes.txt"
    taken.write_text("mine")
    done = _cli("vllm", "tiny-model", str(taken), "--python", vllm_python())
    _refused(done, "agentclaims vllm", f"DIR: {taken} exists and is not a directory")
    assert taken.read_text() == "mine"


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (("--claims-key", "secret-key"), "--claims-key: stock vLLM (--no-connector) has no"),
        (("--max-ttl-s", "60"), "--max-ttl-s: is the connector's; stock vLLM"),
        (("--max-defer-s", "5"), "--max-defer-s: is the connector's; stock vLLM"),
        (("--max-ttl-s", "600"), "--max-ttl-s: is the connector's; stock vLLM"),  # its default too
    ],
    ids=" ".join,
)
def test_a_connector_flag_on_stock_vllm_is_refused_not_ignored(
    options: tuple[str, ...], says: str, tmp_path: Path
) -> None:
    done = _cli(
        *("vllm", "serve", "--model", str(tmp_path), "--port", str(free_port())),
        *("--python", vllm_python(), "--no-connector", *options),
    )
    _refused(done, "agentclaims vllm", says)
    assert "secret-key" not in done.stderr


def test_vllm_serve_on_a_busy_port_is_refused_before_vllm_starts(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")  # a model folder, as far as the checks go
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = _cli(
            *("vllm", "serve", "--model", str(tmp_path), "--port", str(port)),
            *("--python", vllm_python(), "--kv-events", f"ipc://{tmp_path}/kv"),
        )
    _refused(done, "agentclaims vllm", f"--port: cannot listen on 127.0.0.1:{port}")
    assert not (tmp_path / "kv.state.json").exists()  # no state written: nothing started


def test_vllm_serve_on_kv_events_another_server_publishes_on_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "events.kv"
    (tmp_path / "config.json").write_text("{}")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as publisher:
        publisher.bind(str(path))
        publisher.listen()
        done = _cli(
            *("vllm", "serve", "--model", str(tmp_path), "--port", str(free_port())),
            *("--python", vllm_python(), "--kv-events", f"ipc://{path}"),
        )
    _refused(done, "agentclaims vllm", f"--kv-events: ipc://{path} is in use")
    assert not (tmp_path / "events.kv.state.json").exists()


@pytest.mark.parametrize(
    ("upstream", "says"),
    [
        ("127.0.0.1:8000", "--upstream: must be the server's http(s) URL"),
        ("http://", "--upstream: names no host"),
        ("http://127.0.0.1:99999", "--upstream: is not a URL (Port out of range"),
        ("http://127.0.0.1:0", "--upstream: names port 0"),
    ],
)
def test_an_upstream_that_names_no_server_is_refused(upstream: str, says: str) -> None:
    done = _cli("serve", "--kv", "vllm", "--upstream", upstream, "--claims-key", "k", "--port", "0")
    _refused(done, "agentclaims serve", says)


def test_vllm_python_without_kv_events_is_refused_not_ignored() -> None:
    """Only the KV-events relay runs the vLLM environment's Python: given alone, the flag
    would do nothing (and a wrong path would go unnoticed)."""
    done = _cli(
        *("serve", "--kv", "vllm", "--upstream", "http://127.0.0.1:9", "--claims-key", "k"),
        *("--port", "0", "--vllm-python", "/nonexistent/python"),
    )
    _refused(done, "agentclaims serve", "--vllm-python: needs --kv-events")
