"""``agentclaims serve``: the gateway app (reference engine + scripted model) on a port."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from agentclaims.errors import UsageError

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; 2 on bad arguments, 3 when uvicorn is not installed."""
    from agentclaims.engine import ReferenceKV
    from agentclaims.gateway import ScriptedModel, create_app

    try:
        if args.kv == "vllm":
            kv, text = _vllm_side(args)
        else:
            kv, text = ReferenceKV.create(args.blocks, args.block_size or 16), ScriptedModel()
        if not 0 <= args.port <= 65535:
            raise UsageError("port", f"must be within 0..65535, got {args.port}")
    except UsageError as exc:
        print(f"agentclaims serve: {exc}", file=sys.stderr)
        return 2
    try:
        import uvicorn
    except ImportError:
        print(
            "agentclaims serve: uvicorn is not installed; install the `serve` extra",
            file=sys.stderr,
        )
        return 3
    app = create_app(kv, text)
    side = (
        f"vLLM at {args.upstream} with the agentclaims connector"
        if args.kv == "vllm"
        else f"reference engine, {args.blocks} blocks x {args.block_size or 16} tokens"
    )
    print(
        f"agentclaims gateway: {side}, http://{args.host}:{args.port}/v1",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


def _vllm_side(args: argparse.Namespace) -> tuple[Any, Any]:
    """The KV side on vLLM (``--upstream``, ``--claims-key``) and its text side (the same)."""
    import os

    from agentclaims.vllm.kv import UpstreamText, VllmKV

    if not args.upstream:
        raise UsageError(
            "upstream", "--kv vllm needs --upstream http://HOST:PORT (the vLLM server)"
        )
    key = args.claims_key or os.environ.get("AGENTCLAIMS_CLAIMS_KEY")
    if not key:
        raise UsageError("claims_key", "--kv vllm needs the connector's --claims-key")
    kv = VllmKV(args.upstream, key, block_size=args.block_size or 32)
    return kv, UpstreamText(kv)
