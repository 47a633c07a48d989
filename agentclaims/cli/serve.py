"""``agentclaims serve``: the gateway (reference engine + scripted model, or vLLM) on a port.

An operator's server: tenants from ``--api-keys``, a durable ``--ledger``, and a graceful
stop on SIGTERM (new requests get an explicit 503, the ones in flight finish within
``--grace-s``, the ledger takes the last events and is checkpointed). docs/operations.md.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentclaims.errors import AgentClaimsError, UsageError

if TYPE_CHECKING:
    from agentclaims.gateway import KVSide
    from agentclaims.gateway.text import TextSide
    from agentclaims.vllm.kv import VllmKV

__all__ = ["run"]


def _say(message: str) -> None:
    print(f"agentclaims gateway: {message}", file=sys.stderr, flush=True)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(args: argparse.Namespace) -> int:
    """Serve until stopped; 2 on bad arguments, 3 when uvicorn is not installed."""
    from agentclaims.engine import ReferenceKV, ServiceTimes
    from agentclaims.gateway import Instance, ScriptedModel, create_app
    from agentclaims.gateway.ledger import Ledger
    from agentclaims.gateway.tenants import TenantKeys
    from agentclaims.gateway.text import load_script

    try:
        if not 0 <= args.port <= 65535:
            raise UsageError("port", f"must be within 0..65535, got {args.port}")
        if not args.grace_s >= 0:
            raise UsageError("grace_s", f"must be a non-negative number, got {args.grace_s}")
        keys = None if args.api_keys is None else TenantKeys.load(args.api_keys)
        if keys is None and not _loopback(args.host) and not args.allow_unauthenticated:
            raise UsageError(
                "host",
                f"{args.host} is not a loopback address and no --api-keys are given: anyone "
                "who reaches it could act as any owner (pass --api-keys FILE, or "
                "--allow-unauthenticated if that is what you want)",
            )
        kv: KVSide
        text: TextSide | None = None  # vLLM writes its own replies
        if args.kv == "vllm":
            kv = _vllm_side(args)
        else:
            service = (
                None
                if args.decode_ms is None
                else ServiceTimes(decode_s_per_token=args.decode_ms / 1000)
            )
            script = None
            if getattr(args, "script", None):
                try:
                    source = Path(args.script).read_text(encoding="utf-8")
                except OSError as exc:
                    raise UsageError("script", f"cannot read {args.script!r}: {exc}") from None
                script = load_script(source)
            kv = ReferenceKV.create(args.blocks, args.block_size or 16, service=service)
            text = ScriptedModel(script)
        ledger = None if args.ledger is None else Ledger(args.ledger)
        instance = Instance(
            args.instance_id or f"{args.host}:{args.port}",
            args.advertise_url or f"http://{args.host}:{args.port}",
            args.behind_router,
        )
        app = create_app(
            kv,
            text,
            keys=keys,
            ledger=ledger,
            instance=instance,
            promote=args.promote,
            promote_share=args.promote_share,
        )
    except AgentClaimsError as exc:
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
    side = (
        f"vLLM at {args.upstream} with the agentclaims connector"
        if args.kv == "vllm"
        else f"reference engine, {args.blocks} blocks x {args.block_size or 16} tokens"
    )
    _say(f"{side}, http://{args.host}:{args.port}/v1")
    if keys is None:
        _say(
            "no --api-keys: every client may act as any owner scope"
            + (" (bound to loopback only)" if _loopback(args.host) else "")
        )
    else:
        _say(f"{len(keys.tenants)} tenants from {args.api_keys}: every request needs its key")
    _say(
        f"claim ledger {args.ledger} (SQLite, WAL)"
        if ledger is not None
        else "no --ledger: claims live in memory only; a restart forgets them"
    )
    _say(
        f"instance {instance.instance_id} ({instance.advertise_url})"
        + ("; behind a router: deferrals answer 409" if instance.behind_router else "")
    )
    gateway = app.state.gateway
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        async with inner(app):  # its end closes the KV side (create_app)
            yield
        _say("stopped" + ("; ledger flushed" if ledger is not None else ""))

    app.router.lifespan_context = lifespan

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if not gateway.service.stopping:
                _say(f"signal {sig}: stopping; new requests get 503, in-flight ones finish")
            gateway.service.stopping = True
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM:  # a service manager's clean stop exits 0, not by the signal
                with contextlib.suppress(ValueError, AttributeError):
                    self._captured_signals.remove(sig)

    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=args.grace_s,
        # longer than clients keep an idle connection (httpx: 5 s), so the server never closes
        # one a client is just reusing (a reset the client cannot tell from a failure)
        timeout_keep_alive=args.keep_alive_s,
    )
    Server(config).run()  # uvicorn re-raises SIGINT once it is done (SIGTERM: exit 0)
    return 0


def _vllm_side(args: argparse.Namespace) -> VllmKV:
    """The KV side on vLLM (``--upstream``, ``--claims-key``); vLLM writes the replies."""
    import os

    from agentclaims.vllm.kv import VllmKV

    if not args.upstream:
        raise UsageError(
            "upstream", "--kv vllm needs --upstream http://HOST:PORT (the vLLM server)"
        )
    key = args.claims_key or os.environ.get("AGENTCLAIMS_CLAIMS_KEY")
    if not key:
        raise UsageError("claims_key", "--kv vllm needs the connector's --claims-key")
    from agentclaims.vllm.observer import replay_endpoint

    events = args.kv_events
    return VllmKV(
        args.upstream,
        key,
        block_size=args.block_size or 32,
        kv_events=events,
        kv_events_replay=replay_endpoint(events) if events else None,
        events_python=args.vllm_python,
        ride_bound_s=args.ride_bound_s,
        **({} if args.max_prefix_tokens is None else {"max_prefix_tokens": args.max_prefix_tokens}),
    )
