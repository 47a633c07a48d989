"""The connector refuses to start where it cannot keep its promise, with a clear message."""

from __future__ import annotations

from typing import Any

__all__ = ["SUPPORTED_VLLM", "check_engine", "check_pool"]

SUPPORTED_VLLM = ("0.32.", "0.33.")
_POOL_HOOKS = (
    "touch",
    "free_blocks",
    "get_num_free_blocks",
    "get_cached_block",
    "blocks",
    "num_gpu_blocks",
)


class UnsupportedEngine(RuntimeError):
    """The vLLM version or model kind is one the connector was not built for."""


def check_engine(vllm_config: Any, kv_cache_config: Any) -> None:
    """A supported vLLM, prefix caching on, and one full-attention KV cache group."""
    import vllm

    version = getattr(vllm, "__version__", "?")
    if not str(version).startswith(SUPPORTED_VLLM):
        raise UnsupportedEngine(
            f"agentclaims connector supports vLLM {', '.join(v + 'x' for v in SUPPORTED_VLLM)}; "
            f"this is {version}"
        )
    if not vllm_config.cache_config.enable_prefix_caching:
        raise UnsupportedEngine("agentclaims connector needs --enable-prefix-caching")
    groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
    if len(groups) != 1:
        raise UnsupportedEngine(
            f"agentclaims connector supports one KV cache group (full attention), got "
            f"{len(groups)}: hybrid models are not supported"
        )
    spec = groups[0].kv_cache_spec
    if type(spec).__name__ != "FullAttentionSpec" or getattr(spec, "sliding_window", None):
        raise UnsupportedEngine(
            f"agentclaims connector supports full attention only, got {type(spec).__name__}"
            " (sliding-window and other kinds drop blocks a claim would hold)"
        )


def check_pool(pool: Any) -> None:
    """The block pool hooks the connector binds to exist."""
    missing = [name for name in _POOL_HOOKS if not hasattr(pool, name)]
    if missing:
        raise UnsupportedEngine(f"agentclaims connector: vLLM's BlockPool lacks {missing}")
