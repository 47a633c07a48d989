"""What a new user meets first on the command line: ``agentclaims --version``, and where the
vLLM commands look for the vLLM environment (from any folder), with errors that name the flag
of the command that was run."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import agentclaims
from agentclaims.errors import UsageError
from agentclaims.vllm import launch

ROOT = Path(__file__).resolve().parents[2]


def _cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != launch.ENV_PYTHON}
    return subprocess.run(
        [sys.executable, "-m", "agentclaims.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
        env={**base, **(env or {})},
    )


def test_version_prints_the_projects_version(tmp_path: Path) -> None:
    with (ROOT / "pyproject.toml").open("rb") as f:
        declared = tomllib.load(f)["project"]["version"]
    done = _cli("--version", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"agentclaims {declared}"
    assert agentclaims.__version__ == declared


def test_python_dash_m_runs_the_same_command(tmp_path: Path) -> None:
    # a venv whose scripts folder is not on PATH: ``python -m agentclaims`` is the command
    done = subprocess.run(
        [sys.executable, "-m", "agentclaims", "report", str(tmp_path / "no-logs")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert "no-logs" in done.stderr
    assert "Traceback" not in done.stderr
    version = subprocess.run(
        [sys.executable, "-m", "agentclaims", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=tmp_path,
    )
    assert version.stdout.strip() == f"agentclaims {agentclaims.__version__}"


def _fake_python(folder: Path) -> Path:
    python = folder / ".venv-vllm" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    return python


def test_the_checkout_is_the_folder_the_package_runs_from() -> None:
    assert launch.checkout_root() == ROOT


def test_the_environment_is_found_beside_the_checkout_from_any_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkout = tmp_path / "checkout"
    python = _fake_python(checkout)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.delenv(launch.ENV_PYTHON, raising=False)
    monkeypatch.setattr(launch, "checkout_root", lambda: checkout)
    assert launch.vllm_python() == str(python)
    here = _fake_python(elsewhere)  # the current folder's environment comes first
    assert launch.vllm_python() == str(here)


@pytest.mark.parametrize("flag", ["--python", "--vllm-python"])
def test_no_environment_is_an_error_naming_the_commands_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: str
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(launch.ENV_PYTHON, raising=False)
    monkeypatch.setattr(launch, "checkout_root", lambda: None)
    with pytest.raises(UsageError, match="no vLLM environment found") as caught:
        launch.vllm_python(flag=flag)
    assert caught.value.field == flag
    assert f"pass {flag} /" in caught.value.message
    assert launch.ENV_PYTHON in caught.value.message


def test_serve_names_its_own_flag_for_a_python_that_is_not_one(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-python"
    done = _cli(
        "serve", "--kv", "vllm", "--upstream", "http://127.0.0.1:9", "--claims-key", "k",
        "--kv-events", f"ipc://{tmp_path}/kv", "--vllm-python", str(missing), "--port", "0",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"--vllm-python: {missing} is not an executable Python" in done.stderr


def test_vllm_commands_name_python_for_a_python_that_is_not_one(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-python"
    done = _cli("vllm", "tiny-model", str(tmp_path / "m"), "--python", str(missing), cwd=tmp_path)
    assert done.returncode == 2
    assert f"--python: {missing} is not an executable Python" in done.stderr
    assert not (tmp_path / "m").exists()
