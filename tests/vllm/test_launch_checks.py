"""`agentclaims vllm serve` refuses an impossible value before vLLM starts: exit status 2, one
line naming the flag as it was typed, no traceback, and no claims key made up and printed
(a key is printed only once the launch goes ahead). No vLLM runs here: the supervisor that
would start it is replaced by one that fails the test if it is ever reached."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from servers import free_port

from agentclaims.cli.main import main
from agentclaims.errors import UsageError
from agentclaims.vllm import supervise
from agentclaims.vllm.launch import serve_argv


@pytest.fixture
def no_vllm(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The command lines vLLM would have been started with (none is started)."""
    started: list[list[str]] = []

    def run(self: supervise.Supervisor) -> int:
        started.append(list(self.argv))
        return 0

    monkeypatch.setattr(supervise.Supervisor, "run", run)
    monkeypatch.delenv("AGENTCLAIMS_CLAIMS_KEY", raising=False)
    return started


def _serve(model: Path | str, *args: str) -> list[str]:
    # the running Python stands in for the vLLM environment's: nothing is started with it
    return ["vllm", "serve", "--model", str(model), "--python", sys.executable, *args]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--port", "70000"], "--port: must be within 1..65535, got 70000"),
        (["--port", "-1"], "--port: must be within 1..65535, got -1"),
        (["--port", "0"], "--port: must be within 1..65535, got 0"),
        (["--host", ""], "--host: must be a host name or address, got ''"),
        (["--max-ttl-s", "-1"], "--max-ttl-s: must be a positive number of seconds, got -1"),
        (["--max-ttl-s", "nan"], "--max-ttl-s: must be a positive number of seconds, got nan"),
        (["--max-defer-s", "-5"], "--max-defer-s: must be a positive number of seconds, got -5"),
        (["--max-model-len", "0"], "--max-model-len: must be a positive integer, got 0"),
        (["--max-model-len", "-10"], "--max-model-len: must be a positive integer, got -10"),
        (["--blocks", "-3"], "--blocks: must be a positive integer, got -3"),
        (["--blocks", "5"], "--blocks: (5 - 1) x --block-size 32 is below --max-model-len 256"),
        (["--block-size", "48"], "--block-size: must be a positive multiple of 32 on CPU, got 48"),
        (["--block-size", "0"], "--block-size: must be a positive multiple of 32 on CPU, got 0"),
        (["--kv-events", "tcp://x"], "--kv-events: must be an ipc:// endpoint"),
        (["--dtype", "int4"], "--dtype: must be one of auto, bfloat16, float32, float16"),
        (["--ready-timeout-s", "0"], "--ready-timeout-s: must be a positive number of seconds"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_an_impossible_value_is_refused_naming_the_flag_before_vllm_starts(
    args: list[str],
    says: str,
    tmp_path: Path,
    no_vllm: list[list[str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(_serve(tmp_path, *args)) == 2  # the model folder exists: the flag is the fault
    err = capsys.readouterr().err
    assert err.startswith(f"agentclaims vllm: {says}"), err
    assert len(err.splitlines()) == 1, err  # that line alone: no key, no traceback
    assert "claims key" not in err
    assert no_vllm == []


def test_a_missing_model_prints_no_claims_key(
    tmp_path: Path, no_vllm: list[list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nonexistent"
    assert main(_serve(missing)) == 2
    err = capsys.readouterr().err
    assert err == (
        f"agentclaims vllm: --model: {missing} is not a model directory "
        "(no config.json; build one: agentclaims vllm tiny-model DIR)\n"
    )
    assert no_vllm == []


def test_a_folder_without_a_model_is_refused_before_vllm_starts(
    tmp_path: Path, no_vllm: list[list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty folder (a download not done yet, a typo one level up) is no model: vLLM would
    load for seconds and die on it with a traceback."""
    assert main(_serve(tmp_path)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"agentclaims vllm: --model: {tmp_path} is not a model directory"), err
    assert "claims key" not in err
    assert no_vllm == []


def test_the_key_is_made_and_printed_only_once_the_launch_goes_ahead(
    tmp_path: Path, no_vllm: list[list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()  # a busy one is refused (tests/vllm/test_operator_flags.py)
    (tmp_path / "config.json").write_text("{}")  # a model folder, as far as the launch checks
    assert main(_serve(tmp_path, "--dtype", "float32", "--port", str(port))) == 0
    err = capsys.readouterr().err
    assert err.startswith("agentclaims vllm: claims key "), err
    key = err.split()[3]
    assert len(no_vllm) == 1
    argv = no_vllm[0]
    assert key in argv[argv.index("--kv-transfer-config") + 1]  # the key vLLM was given
    assert argv[argv.index("--port") + 1] == str(port)


def test_serve_argv_names_the_flags() -> None:
    """The library call names the same flags (it is the check `vllm serve` runs)."""
    for kwargs, flag in (
        ({"port": 70000}, "--port"),
        ({"host": ""}, "--host"),
        ({"max_ttl_s": -1.0}, "--max-ttl-s"),
        ({"max_defer_s": -5.0}, "--max-defer-s"),
        ({"max_model_len": 0}, "--max-model-len"),
        ({"num_blocks": -3}, "--blocks"),
        ({"num_blocks": 5}, "--blocks"),
        ({"block_size": 33}, "--block-size"),
        ({"claims_key": None}, "--claims-key"),
    ):
        args: dict[str, object] = {"port": 8000, "claims_key": "k", **kwargs}
        with pytest.raises(UsageError) as caught:
            serve_argv("/nonexistent", python="python", **args)  # type: ignore[arg-type]
        assert caught.value.field == flag, (kwargs, caught.value)
