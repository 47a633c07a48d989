"""``agentclaims vllm tiny-model DIR`` and ``agentclaims vllm serve --model DIR --port N``.

Both run in the vLLM server's own environment (found by ``agentclaims.vllm.vllm_python``).
``serve`` runs vLLM under a supervisor (``agentclaims.vllm.supervise``): it says ``ready`` only
once the engine has served one completion, SIGTERM stops vLLM and its engine (exit 0), and a
vLLM that dies on its own (at start or later) ends it with exit status 1 and a message naming
the process and signal. Exit status 2 on bad arguments or a missing environment: every
argument is checked before vLLM starts and before a claims key is made up and printed.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys

from agentclaims.errors import UsageError

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    from agentclaims.cli.listen import listen
    from agentclaims.vllm.launch import (
        check_kv_events_free,
        default_kv_events,
        new_claims_key,
        serve_argv,
        server_env,
        vllm_python,
    )

    try:
        if args.vllm == "tiny-model":
            _check_tiny_model(args)
        python = vllm_python(args.python)
        if args.vllm == "tiny-model":
            cmd = [python, "-m", "agentclaims_vllm.tiny_model", args.directory]
            cmd += ["--layers", str(args.layers), "--hidden", str(args.hidden)]
            return subprocess.run(cmd, check=False).returncode
        timeout = args.ready_timeout_s
        if not (timeout > 0 and math.isfinite(timeout)):
            raise UsageError(
                "--ready-timeout-s", f"must be a positive number of seconds, got {timeout:g}"
            )
        key = None
        made_key = False
        if args.no_connector:
            _check_no_connector(args)
        else:
            key = args.claims_key or os.environ.get("AGENTCLAIMS_CLAIMS_KEY")
            if not key:
                key, made_key = new_claims_key(), True  # printed once every check has passed
        extra = list(args.vllm_args)
        if extra[:1] == ["--"]:
            extra = extra[1:]
        argv = serve_argv(
            args.model,
            python=python,
            port=args.port,
            host=args.host,
            claims_key=key,
            num_blocks=args.blocks,
            block_size=args.block_size,
            max_model_len=args.max_model_len,
            **{
                name: getattr(args, name)
                for _, name in _CONNECTOR_FLAGS
                if getattr(args, name) is not None
            },
            connector=not args.no_connector,
            kv_events=args.kv_events,
            dtype=args.dtype,
            extra=extra,
        )
        # last, once every value is known good: nothing else may have the port or the events
        # (vLLM would fail to bind them only after its imports, its readiness probe meanwhile
        # reaching the other server)
        for sock in listen(args.host, args.port):
            sock.close()
        events = args.kv_events or default_kv_events(args.port)
        check_kv_events_free(events)
    except UsageError as exc:
        print(f"agentclaims vllm: {exc}", file=sys.stderr)
        return 2
    if made_key:
        print(f"agentclaims vllm: claims key {key} (pass it to the gateway)", file=sys.stderr)
    env = server_env(dev_mode=args.dev_mode)
    print(
        f"agentclaims vllm: KV events on {events} (pass it to the gateway: --kv-events)",
        file=sys.stderr,
    )
    if key:
        env["AGENTCLAIMS_CLAIMS_KEY"] = key
    sys.stderr.flush()
    from agentclaims.vllm.supervise import Supervisor

    host = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
    url = f"http://{host}:{args.port}"
    return Supervisor(
        argv, env, url=url, kv_events=events, ready_timeout_s=args.ready_timeout_s
    ).run()


def _check_tiny_model(args: argparse.Namespace) -> None:
    """``tiny-model``'s values, each refused naming its flag before the vLLM environment runs."""
    if args.layers < 1:
        raise UsageError("--layers", f"must be a positive integer, got {args.layers}")
    if args.hidden < 64 or args.hidden % 64:
        raise UsageError("--hidden", f"must be a positive multiple of 64, got {args.hidden}")
    if os.path.exists(args.directory) and not os.path.isdir(args.directory):
        raise UsageError("DIR", f"{args.directory} exists and is not a directory")


_CONNECTOR_FLAGS = (("--max-ttl-s", "max_ttl_s"), ("--max-defer-s", "max_defer_s"))
"""``serve``'s connector flags (``None`` unless given; ``serve_argv`` has their defaults): stock
vLLM (``--no-connector``) reads none."""


def _check_no_connector(args: argparse.Namespace) -> None:
    """A connector's flag given with ``--no-connector`` is refused, never ignored."""
    if args.claims_key is not None:
        raise UsageError("--claims-key", "stock vLLM (--no-connector) has no connector to key")
    for flag, name in _CONNECTOR_FLAGS:
        if getattr(args, name) is not None:
            raise UsageError(flag, "is the connector's; stock vLLM (--no-connector) has none")
