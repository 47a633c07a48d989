"""`agentclaims vllm tiny-model DIR [--layers N] [--hidden H]`: the random-weight Llama the
tests and benchmarks serve, in the shape asked for (built in the real vLLM environment), and
a shape it cannot build refused before anything is written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from agentclaims_vllm.tiny_model import build


def _tiny_model(directory: Path, *options: str) -> subprocess.CompletedProcess[str]:
    from agentclaims.vllm import vllm_python

    command = ["vllm", "tiny-model", str(directory), *options, "--python", vllm_python()]
    return subprocess.run(
        [sys.executable, "-m", "agentclaims.cli.main", *command],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_deeper_wider_model_is_built_as_asked(tmp_path: Path) -> None:
    out = tmp_path / "m"
    done = _tiny_model(out, "--layers", "3", "--hidden", "192")
    assert done.returncode == 0, done.stderr[-2000:]
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 3
    assert config["hidden_size"] == 192
    assert config["intermediate_size"] == 384
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (6, 3)


@pytest.mark.parametrize(
    ("shape", "named"), [({"hidden": 100}, "hidden"), ({"layers": 0}, "layers")]
)
def test_a_shape_it_cannot_build_is_refused_first(
    tmp_path: Path, shape: dict[str, int], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        build(tmp_path / "m", **shape)
    assert not (tmp_path / "m").exists()


def test_the_command_refuses_it_with_status_2(tmp_path: Path) -> None:
    done = _tiny_model(tmp_path / "m", "--hidden", "100")
    assert done.returncode == 2
    assert "multiple of 64" in done.stderr
