"""`agentclaims serve` refuses a vLLM-only flag without `--kv vllm` (it would otherwise serve the
reference engine's echo replies, the flag ignored), and on `--kv vllm` the reference engine's
own flags and a KV events endpoint `agentclaims vllm serve` would refuse: exit status 2, one line naming the flag as it was typed,
before any port is bound or anything is built. No vLLM runs here."""

from __future__ import annotations

import socket

import pytest

from agentclaims.cli import serve
from agentclaims.cli.main import build_parser, main

UPSTREAM = ("--kv", "vllm", "--upstream", "http://127.0.0.1:9", "--claims-key", "k")


@pytest.fixture
def nothing_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Binding a port fails the test: every refusal here comes before it."""

    def listen(host: str, port: int) -> list[socket.socket]:
        raise AssertionError(f"bound {host}:{port} before refusing")

    monkeypatch.setattr(serve, "listen", listen)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--upstream", "http://127.0.0.1:8000"], "--upstream: needs --kv vllm (the reference "),
        (["--claims-key", "secret-key"], "--claims-key: needs --kv vllm"),
        (["--kv-events", "ipc:///tmp/x.kv"], "--kv-events: needs --kv vllm"),
        (["--vllm-python", "/usr/bin/python3"], "--vllm-python: needs --kv vllm"),
        (["--ride-bound-s", "0.05"], "--ride-bound-s: needs --kv vllm"),
        (["--max-prefix-tokens", "1000"], "--max-prefix-tokens: needs --kv vllm"),
        (["--promote", "2"], "--promote: needs --kv vllm (the reference engine has no queue"),
        (["--promote-share", "0.5"], "--promote-share: needs --kv vllm"),
        (["--kv", "reference", "--upstream", "http://h:1"], "--upstream: needs --kv vllm"),
        ([*UPSTREAM, "--kv-events", "tcp://x"], "--kv-events: must be an ipc:// endpoint"),
        ([*UPSTREAM, "--kv-events", ""], "--kv-events: must be an ipc:// endpoint"),
        # and the reference engine's own flags on --kv vllm, where they would do nothing
        ([*UPSTREAM, "--script", "replies.json"], "--script: is the reference engine's"),
        ([*UPSTREAM, "--decode-ms", "0.5"], "--decode-ms: is the reference engine's"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_a_flag_out_of_its_place_is_refused_naming_it(
    args: list[str], says: str, nothing_bound: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--port", "0", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"agentclaims serve: {says}"), err
    assert len(err.splitlines()) == 1, err  # that line alone: no traceback
    assert "secret-key" not in err  # the refusal names the flag, never the secret given


def test_the_vllm_flags_reach_the_vllm_side(monkeypatch: pytest.MonkeyPatch) -> None:
    """On `--kv vllm` the same flags are taken, and the ride bound's default is VllmKV's."""
    from agentclaims.vllm import kv

    seen: dict[str, object] = {}

    class Recorded(Exception):
        pass

    def fake(upstream: str, key: str, **kwargs: object) -> None:
        seen.update(kwargs, upstream=upstream, key=key)
        raise Recorded

    monkeypatch.setattr(kv, "VllmKV", fake)
    parser_args = ["serve", *UPSTREAM, "--kv-events", "ipc:///tmp/x.kv", "--ride-bound-s", "1"]
    with pytest.raises(Recorded):
        serve._vllm_side(build_parser().parse_args(parser_args))
    assert seen["ride_bound_s"] == 1.0
    assert seen["kv_events"] == "ipc:///tmp/x.kv"
    seen.clear()
    with pytest.raises(Recorded):
        serve._vllm_side(build_parser().parse_args(["serve", *UPSTREAM]))
    assert "ride_bound_s" not in seen  # VllmKV's own default (0.05 s)
