"""A bare pass-through proxy, the floor for the gateway's added latency: the same server
stack as `agentclaims serve` (uvicorn on httptools and uvloop) and the same HTTP client to
vLLM (`agentclaims.vllm.upstream.Upstream`, on aiohttp), with none of the gateway's work.
Each request's JSON is parsed and encoded again, as any proxy that reads what it forwards
does, with the gateway's own JSON codec (``agentclaims._json``); a streamed one (``stream:
true``) event by event, as vLLM sends them. Used by benchmarks/bench_gateway_latency.py::

    python benchmarks/passthrough_proxy.py --port 18003 --upstream http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
from typing import Any

_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


def make_app(upstream: str) -> Any:
    from agentclaims._json import dumps, loads
    from agentclaims.gateway.streaming import DONE, event  # the same event framing
    from agentclaims.vllm.upstream import Upstream

    client = Upstream(upstream)  # the gateway's own client to vLLM, as it configures it

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await client.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] == "/health":
            status, out = 200, b"{}"
        else:
            forwarded = loads(body) if body else None
            if isinstance(forwarded, dict) and forwarded.get("stream") is True:
                await _stream(client, scope["path"], forwarded, send)
                return
            status, raw = await client.request(scope["method"], scope["path"], forwarded)
            out = dumps(loads(raw))
        headers = [*_JSON, (b"content-length", str(len(out)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": out})

    async def _stream(client: Any, path: str, body: dict[str, Any], send: Any) -> None:
        """A streamed call: each event parsed and written again, those that came together
        in one write (as the gateway passes vLLM's on)."""
        stream = await client.stream(path, body)
        try:
            start = {"type": "http.response.start", "status": stream.status, "headers": _SSE}
            await send(start)
            async for batch in stream.batches():
                out = b"".join(map(event, batch))
                await send({"type": "http.response.body", "body": out, "more_body": True})
            await send({"type": "http.response.body", "body": DONE})
        finally:
            await stream.aclose()

    return app


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    app = make_app(args.upstream.rstrip("/"))
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
