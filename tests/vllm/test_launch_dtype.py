"""``agentclaims vllm serve --dtype``: ``auto`` runs bf16 only where the CPU computes it
natively, float32 elsewhere (bf16 is emulated on AVX2, several times slower); a bad dtype is a
typed error naming the field, and the command line carries the dtype chosen."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentclaims.errors import UsageError
from agentclaims.vllm.launch import default_dtype, serve_argv

AVX2 = "processor: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
AVX512_BF16 = "flags\t\t: fpu avx2 avx512f avx512_bf16\n"
AMX = "flags\t\t: fpu avx2 avx512f amx_bf16 amx_tile amx_int8\n"


def test_auto_is_bf16_only_where_the_cpu_has_native_bf16() -> None:
    assert default_dtype(AVX2) == "float32"
    assert default_dtype(AVX512_BF16) == "bfloat16"
    assert default_dtype(AMX) == "bfloat16"
    assert default_dtype("") == "float32"  # no flags line: what runs everywhere


def test_the_command_line_carries_the_dtype_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    def dtype_of(argv: list[str]) -> str:
        return argv[argv.index("--dtype") + 1]

    (tmp_path / "config.json").write_text("{}")  # a model folder, as far as the checks go
    argv = serve_argv(str(tmp_path), python="python", port=8000, claims_key="k", dtype="float16")
    assert dtype_of(argv) == "float16"
    assert (
        dtype_of(serve_argv(str(tmp_path), python="python", port=8000, claims_key="k"))
        == default_dtype()
    )
    with pytest.raises(UsageError, match="dtype"):
        serve_argv(str(tmp_path), python="python", port=8000, claims_key="k", dtype="int4")
