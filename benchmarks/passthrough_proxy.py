"""A bare pass-through proxy, the floor for the gateway's added latency: the same server
stack as `agentclaims serve` (uvicorn on httptools and uvloop) and the same HTTP client to vLLM
(aiohttp), with none of the gateway's work. Each request's JSON is parsed and encoded again,
as any proxy that reads what it forwards does. Used by benchmarks/bench_gateway_latency.py::

    python benchmarks/passthrough_proxy.py --port 18003 --upstream http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import json
from typing import Any

_JSON = [(b"content-type", b"application/json")]


def make_app(upstream: str) -> Any:
    import aiohttp

    session: list[aiohttp.ClientSession] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            if session:
                await session[0].close()
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
            if not session:
                session.append(
                    aiohttp.ClientSession(
                        connector=aiohttp.TCPConnector(limit=256, keepalive_timeout=3.0)
                    )
                )
            data = json.dumps(json.loads(body)).encode() if body else None
            async with session[0].request(
                scope["method"],
                upstream + scope["path"],
                data=data,
                headers={"content-type": "application/json"},
            ) as response:
                status, raw = response.status, await response.read()
            out = json.dumps(json.loads(raw)).encode()
        headers = [*_JSON, (b"content-length", str(len(out)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": out})

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
