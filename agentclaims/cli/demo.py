"""``agentclaims demo``: concurrent supervisor workflows on a KV pool smaller than their working
set, with the claim planner and as stock LRU without claims, side by side: ``rounds`` rounds
on fresh engines, the two modes interleaved (their order alternating), each figure the median
of its mode's rounds. One run of each would mostly measure which workflow the event loop
happened to serve last."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from agentclaims.cli.heap import settled_heap
from agentclaims.errors import UsageError

__all__ = ["run", "run_demo"]

BLOCK_SIZE = 16


def _service() -> Any:
    from agentclaims.engine import ServiceTimes

    # A mid-size model on one accelerator: recomputing a 1,000-token prefix costs ~0.1 s.
    return ServiceTimes(prefill_s_per_token=100e-6, decode_s_per_token=2e-3)


async def _one_mode(
    mode: str, workflows: int, blocks: int, seed: int, logs: Path
) -> dict[str, Any]:
    from langchain_core.messages import HumanMessage

    from agentclaims.backends.embedded import EmbeddedBackend

    SERVICE = _service()
    from agentclaims.bindings.decorators import claimed_session
    from agentclaims.bindings.langchain import chat_model
    from agentclaims.demo.workflows import build_supervisor, script, task_for
    from agentclaims.session import ClaimedSession

    for stale in (logs / mode).glob(f"{mode}-wf*.jsonl"):  # a log appends: this run's alone
        stale.unlink()
    backend = EmbeddedBackend(
        num_blocks=blocks,
        block_size=BLOCK_SIZE,
        script=script,
        protected_cap_blocks=blocks // 2,
        service=SERVICE,
    )
    claimed = claimed_session(
        build_supervisor(chat_model(backend)),
        backend=backend,
        planner="auto" if mode == "claims" else "off",  # what a user gets by default
        reaction="defer",
        log_dir=logs / mode,
        reload_s_per_block=SERVICE.prefill_s_per_token * BLOCK_SIZE,
    )
    sessions: list[ClaimedSession] = []

    async def workflow(i: int) -> float:
        started = time.monotonic()
        run = claimed.run(workflow_id=f"{mode}-wf{i:02d}")
        sessions.append(run.session_of_run)
        await run.ainvoke({"messages": [HumanMessage(task_for(i, seed))]}, {"recursion_limit": 60})
        return time.monotonic() - started

    started = time.monotonic()
    per_workflow = await asyncio.gather(*(workflow(i) for i in range(workflows)))
    elapsed = time.monotonic() - started
    stats = backend.engine.stats
    prompt = sum(s.stats.prompt_tokens for s in sessions)
    cached = sum(s.stats.cached_tokens for s in sessions)
    await backend.aclose()
    return {
        "hit_ratio": round(cached / prompt, 4) if prompt else 0.0,
        "recomputed_tokens": prompt - cached,
        "prompt_tokens": prompt,
        "refusals": stats.requests_refused,
        "claims_refused": stats.claims_rejected,
        "deferrals": sum(s.stats.deferrals for s in sessions),
        "true_harm": stats.true_harm,
        "completion_s": round(elapsed, 3),
        "mean_workflow_s": round(sum(per_workflow) / len(per_workflow), 3),
        "llm_calls": sum(s.stats.llm_calls for s in sessions),
        "claims": sum(s.stats.claims_accepted for s in sessions),
    }


async def run_demo(
    workflows: int = 6, seed: int = 7, logs: str | Path = "agentclaims-logs", rounds: int = 5
) -> dict[str, Any]:
    """Run both modes ``rounds`` times, interleaved, on fresh engines of the same size; the
    median of each figure per mode (``rounds``: every round's figures). The first round's
    outcome logs are in ``logs/claims`` and ``logs/lru``, later rounds' in
    ``logs/.rounds/N``; each run replaces the demo's own logs of the run before (its
    workflows' ids are the same every run: appended to, they would read as one)."""
    if isinstance(workflows, bool) or not isinstance(workflows, int) or workflows < 1:
        raise UsageError("workflows", f"must be >= 1, got {workflows}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise UsageError("rounds", f"must be >= 1, got {rounds}")
    logs = Path(logs)
    blocks = 48 * workflows  # about a third of the workflows' working set
    # warm up (imports, LangGraph and pydantic caches) so neither timed mode pays for it
    await _one_mode("warmup", 1, blocks, seed, logs / ".warmup")
    runs: dict[str, list[dict[str, Any]]] = {"claims": [], "lru": []}
    for i in range(rounds):
        where = logs if i == 0 else logs / ".rounds" / str(i + 1)
        order = ("claims", "lru") if i % 2 == 0 else ("lru", "claims")
        for mode in order:
            with settled_heap():  # neither mode pays for the other's garbage
                runs[mode].append(await _one_mode(mode, workflows, blocks, seed, where))
    return {
        "claims": _medians(runs["claims"]),
        "lru": _medians(runs["lru"]),
        "rounds": runs,
        "logs": str(logs.resolve()),
        "kv_blocks": blocks,
    }


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over ``runs`` (rounded as the figure itself is)."""
    out: dict[str, Any] = {}
    for key in runs[0]:
        value = statistics.median(run[key] for run in runs)
        out[key] = round(value, 4) if isinstance(value, float) else value
    return out


def _table(result: dict[str, Any]) -> str:
    rows = [
        ("prefix hit ratio", "hit_ratio"),
        ("recomputed prompt tokens", "recomputed_tokens"),
        ("refused requests", "refusals"),
        ("refused claims (relaxed)", "claims_refused"),
        ("deferrals", "deferrals"),
        ("true harm", "true_harm"),
        ("workflow completion (s, all)", "completion_s"),
        ("mean workflow time (s)", "mean_workflow_s"),
        ("LLM calls", "llm_calls"),
        ("claims accepted", "claims"),
    ]
    lines = [f"{'':32}{'claims':>12}{'stock LRU':>12}"]
    for label, key in rows:
        lines.append(f"{label:32}{result['claims'][key]!s:>12}{result['lru'][key]!s:>12}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        result = asyncio.run(run_demo(args.workflows, args.seed, args.logs, args.rounds))
    except UsageError as exc:
        print(f"agentclaims demo: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    print(
        f"{args.workflows} concurrent supervisor workflows, KV pool of {result['kv_blocks']} "
        f"blocks x {BLOCK_SIZE} tokens; medians of {args.rounds} interleaved rounds\n"
    )
    print(_table(result))
    logs = Path(result["logs"])
    print(
        f"\noutcome logs (first round): {logs}/claims and {logs}/lru  (summarise with: agentclaims report "
        f"{logs / 'claims'}; add {logs / 'lru'} for both)"
    )
    return 0
