"""``agentclaims serve``: the gateway (reference engine + scripted model, or vLLM) on a port.

An operator's server: tenants from ``--api-keys``, a durable ``--ledger``, and a graceful
stop on SIGTERM or SIGINT (new requests get an explicit 503, the ones in flight finish within
``--grace-s``, the ledger takes the last events and is checkpointed). docs/operations.md.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import math
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentclaims.cli.listen import listen, netloc
from agentclaims.errors import AgentClaimsError, UsageError

if TYPE_CHECKING:
    from agentclaims.gateway import KVSide
    from agentclaims.gateway.text import TextSide
    from agentclaims.vllm.kv import VllmKV

__all__ = ["MAX_BLOCKS", "run"]

MAX_BLOCKS = 10_000_000
"""The most ``--blocks`` the reference engine is built with (about 1.2 GB of memory)."""

#: the flag of each field a part of the gateway names in its own errors
_FLAGS = {
    "ride_bound_s": "--ride-bound-s",
    "max_prefix_tokens": "--max-prefix-tokens",
    "upstream": "--upstream",
}


def _say(message: str) -> None:
    with contextlib.suppress(OSError):  # a closed stderr must not keep a signal from stopping it
        print(f"agentclaims gateway: {message}", file=sys.stderr, flush=True)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: the flags only ``--kv vllm`` reads (each defaults to None: given or not is plain), with why
#: the reference engine has no use for it; given without ``--kv vllm`` they are refused, never
#: ignored (a gateway meant for vLLM must not come up with the scripted model's echo replies)
_VLLM_ONLY = {
    "--upstream": "the reference engine has no upstream",
    "--claims-key": "the reference engine has no connector to authenticate to",
    "--kv-events": "the reference engine publishes no KV events",
    "--vllm-python": "the reference engine runs no vLLM environment",
    "--ride-bound-s": "the reference engine's releases ride on no request",
    "--max-prefix-tokens": "the reference engine keeps no prompt book",
    "--promote": "the reference engine has no queue of vLLM's to put calls ahead in",
    "--promote-share": "the reference engine has no queue of vLLM's to put calls ahead in",
}
_REFERENCE_ONLY = {
    "--script": "vLLM writes its own replies",
    "--decode-ms": "vLLM's decode takes what it takes",
}


def _check_flags(args: argparse.Namespace) -> None:
    """Each number's bounds and each flag's place, checked before anything is bound or built;
    the error names the flag as it was typed and the value as it was given."""

    def seconds(flag: str, value: float) -> None:
        if not (value >= 0 and math.isfinite(value)):
            raise UsageError(flag, f"must be a non-negative number of seconds, got {value:g}")

    if args.kv != "vllm":
        for flag, why in _VLLM_ONLY.items():
            if getattr(args, flag[2:].replace("-", "_")) is not None:
                raise UsageError(flag, f"needs --kv vllm ({why})")
    else:
        for flag, why in _REFERENCE_ONLY.items():
            if getattr(args, flag[2:].replace("-", "_")) is not None:
                raise UsageError(flag, f"is the reference engine's, not --kv vllm's ({why})")
    if args.kv_events is not None:  # the one kind `agentclaims vllm serve` accepts
        from agentclaims.vllm.launch import check_kv_events

        check_kv_events(args.kv_events)
    elif args.vllm_python is not None:  # only the KV-events relay runs it: never ignored
        raise UsageError("--vllm-python", "needs --kv-events (only its relay runs vLLM's Python)")
    if not 0 <= args.port <= 65535:
        raise UsageError("--port", f"must be within 0..65535, got {args.port}")
    seconds("--grace-s", args.grace_s)
    seconds("--keep-alive-s", args.keep_alive_s)
    if not 1 <= args.blocks <= MAX_BLOCKS:
        raise UsageError("--blocks", f"must be within 1..{MAX_BLOCKS:,}, got {args.blocks}")
    if args.block_size is not None and args.block_size < 1:
        raise UsageError("--block-size", f"must be a positive integer, got {args.block_size}")
    decode = args.decode_ms
    if decode is not None and not (decode >= 0 and math.isfinite(decode)):
        raise UsageError("--decode-ms", f"must be a non-negative number of ms, got {decode:g}")
    if args.promote is not None and args.promote < 0:
        raise UsageError("--promote", f"must be a non-negative integer, got {args.promote}")
    share = args.promote_share
    if share is not None and not 0 < share <= 1:
        raise UsageError("--promote-share", f"must be a number in (0, 1], got {share:g}")


def run(args: argparse.Namespace) -> int:
    """Serve until stopped; 2 on bad arguments, 3 when uvicorn is not installed."""
    from agentclaims.engine import ReferenceKV, ServiceTimes
    from agentclaims.gateway import Instance, ScriptedModel, create_app
    from agentclaims.gateway.ledger import Ledger
    from agentclaims.gateway.tenants import TenantKeys
    from agentclaims.gateway.text import load_script

    sockets: list[socket.socket] = []
    try:
        _check_flags(args)
        keys = None if args.api_keys is None else TenantKeys.load(args.api_keys)
        if keys is None and not _loopback(args.host) and not args.allow_unauthenticated:
            raise UsageError(
                "--host",
                f"{args.host} is not a loopback address and no --api-keys are given: anyone "
                "who reaches it could act as any owner (pass --api-keys FILE, or "
                "--allow-unauthenticated if that is what you want)",
            )
        sockets = listen(args.host, args.port)  # before the engine: a port in use says so first
        where = netloc(args.host, sockets[0].getsockname()[1])  # the port --port 0 got
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
                    raise UsageError("--script", f"cannot read {args.script!r}: {exc}") from None
                script = load_script(source)
            kv = ReferenceKV.create(args.blocks, args.block_size or 16, service=service)
            text = ScriptedModel(script)
        ledger = None if args.ledger is None else Ledger(args.ledger)
        instance = Instance(
            args.instance_id or where, args.advertise_url or f"http://{where}", args.behind_router
        )
        app = create_app(
            kv,
            text,
            keys=keys,
            ledger=ledger,
            instance=instance,
            **({} if args.promote is None else {"promote": args.promote}),
            promote_share=args.promote_share,
        )
    except AgentClaimsError as exc:
        for sock in sockets:
            sock.close()
        if isinstance(exc, UsageError) and exc.field in _FLAGS:
            exc = UsageError(_FLAGS[exc.field], exc.message)
        print(f"agentclaims serve: {exc}", file=sys.stderr)
        return 2
    try:
        import uvicorn
    except ImportError:
        for sock in sockets:
            sock.close()
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
    _say(f"{side}, http://{where}/v1")
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
            """SIGINT (Ctrl-C) as SIGTERM (a service manager's): one clean stop, exit status 0,
            the ledger flushed; not uvicorn's way, which raises SIGINT again once it is done (a
            KeyboardInterrupt) and quits on a second one without the lifespan's end."""
            if self.should_exit:
                _say(f"signal {sig}: already stopping; calls in flight get at most --grace-s")
                return
            _say(f"signal {sig}: stopping; new requests get 503, in-flight ones finish")
            gateway.service.stopping = True
            self.should_exit = True

    config = uvicorn.Config(
        app,
        host=args.host,
        port=sockets[0].getsockname()[1],
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=args.grace_s,
        # longer than clients keep an idle connection (httpx: 5 s), so the server never closes
        # one a client is just reusing (a reset the client cannot tell from a failure)
        timeout_keep_alive=args.keep_alive_s,
    )
    Server(config).run(sockets=sockets)  # listening on the sockets bound above
    return 0


def _vllm_side(args: argparse.Namespace) -> VllmKV:
    """The KV side on vLLM (``--upstream``, ``--claims-key``); vLLM writes the replies."""
    import os

    from agentclaims.vllm.kv import VllmKV

    if not args.upstream:
        raise UsageError(
            "--upstream", "--kv vllm needs --upstream http://HOST:PORT (the vLLM server)"
        )
    key = args.claims_key or os.environ.get("AGENTCLAIMS_CLAIMS_KEY")
    if not key:
        raise UsageError("--claims-key", "--kv vllm needs the connector's --claims-key")
    from agentclaims.vllm.observer import replay_endpoint

    events = args.kv_events
    return VllmKV(
        args.upstream,
        key,
        block_size=args.block_size or 32,
        kv_events=events,
        kv_events_replay=replay_endpoint(events) if events else None,
        events_python=args.vllm_python,
        **({} if args.ride_bound_s is None else {"ride_bound_s": args.ride_bound_s}),
        **({} if args.max_prefix_tokens is None else {"max_prefix_tokens": args.max_prefix_tokens}),
    )
