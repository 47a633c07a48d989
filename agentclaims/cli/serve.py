"""``agentclaims serve``: the gateway app (reference engine + scripted model) on a port."""

from __future__ import annotations

import argparse
import sys

from agentclaims.errors import UsageError

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; 2 on bad arguments, 3 when uvicorn is not installed."""
    from agentclaims.engine import ReferenceKV
    from agentclaims.gateway import ScriptedModel, create_app

    try:
        kv = ReferenceKV.create(args.blocks, args.block_size)
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
    app = create_app(kv, ScriptedModel())
    print(
        f"agentclaims gateway: {args.blocks} blocks x {args.block_size} tokens, "
        f"http://{args.host}:{args.port}/v1",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0
