"""Claims against stock on a matrix of workloads nobody tuned for, on a real vLLM (a script
that prints figures; no test times anything).

Each cell is a workload: the LangGraph supervisor (a supervisor and two tool-using workers) or
the plain agent loop (an agent and a plain I/O node), on the tiny model or the 8 x 512 one,
with a KV pool sized against the agents' working set (roomy: the working set about half the
pool; tight: about 1.5x; over: about 3x), another tenant sending one-shot prompts straight to
vLLM (none, moderate: 1 prompt/s of 600 tokens, heavy: 3 prompts/s of 900), the agents'
waits (short 0.2 s, medium 1-2 s, long 10 s), each agent's own context (a few hundred tokens,
about 1,000, near the longest request) and 4 or 12 agents' workflows at once.

Per cell, vLLM with the agentclaims connector and stock vLLM (each behind a gateway) run the
same workflows in turn: ``claims`` (the SDK as users get it: ``planner="auto"``) and ``stock``
(planner off), ``--repeats`` runs each, the order alternating run by run, medians reported.
Per cell and set-up: workflow completion (the run's wall time, and each workflow's p50),
LLM-call time, time to first token p50 and p99, the cached-token ratio, deferrals (the
sessions' own, and every request vLLM's connector deferred or refused for held claims, the
other tenant's included), and the other tenant's time to first token p99. Each run's figures
go to ``--out`` (JSON lines) as they come, so a long matrix leaves what it measured.

``--layout pinned`` (the default) runs vLLM on the last core, as an accelerator would be, the
gateways and the agents on the others; ``shared`` puts every process on every core. Run::

    .venv/bin/python benchmarks/bench_matrix.py [--cells 1,7] [--layout pinned|shared] [--promote-share F]

(needs the vLLM environment: ``make vllm-env``.) ``--list`` prints the cells and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_vllm as bv

from agentclaims.cli.resample import bootstrap_90

MODELS = {"tiny": (None, None), "8x512": (8, 512)}
POOL_FACTOR = {"roomy": 0.5, "tight": 1.5, "over": 3.0}
"""The agents' working set over the pool."""
TENANT = {"none": (0.0, 0), "moderate": (1.0, 600), "heavy": (3.0, 900)}
"""The other tenant: prompts per second, tokens each."""
WAITS = {"short": (0.2, 0.2), "medium": (1.0, 2.0), "long": (10.0, 10.0)}
CONTEXT = {"few-hundred": 300, "about-1000": 1000, "near-longest": 1300}
"""Each agent's own context, about this many tokens; near-longest leaves its turns room
under the 2,048-token limit."""
MAX_MODEL_LEN = 2048
TURN_TOKENS = 48
"""About what each of an agent's turns adds to its context (prompt, reply, tool result)."""

CELLS = (
    # workload, model, pool, tenant, waits, context, agents
    ("plain", "tiny", "roomy", "none", "short", "few-hundred", 4),
    ("plain", "tiny", "tight", "moderate", "medium", "about-1000", 12),
    ("plain", "tiny", "over", "heavy", "long", "near-longest", 4),
    ("plain", "8x512", "roomy", "moderate", "long", "few-hundred", 12),
    ("plain", "8x512", "tight", "heavy", "short", "about-1000", 4),
    ("plain", "8x512", "over", "none", "medium", "near-longest", 12),
    ("plain", "8x512", "tight", "moderate", "medium", "about-1000", 4),
    ("plain", "8x512", "over", "heavy", "medium", "few-hundred", 4),
    ("plain", "tiny", "roomy", "heavy", "medium", "about-1000", 4),
    ("supervisor", "tiny", "roomy", "none", "medium", "few-hundred", 4),
    ("supervisor", "tiny", "tight", "heavy", "short", "few-hundred", 12),
    ("supervisor", "tiny", "over", "moderate", "long", "about-1000", 4),
    ("supervisor", "8x512", "roomy", "heavy", "medium", "about-1000", 4),
    ("supervisor", "8x512", "tight", "moderate", "short", "few-hundred", 4),
    ("supervisor", "8x512", "over", "heavy", "medium", "about-1000", 12),
    ("supervisor", "8x512", "tight", "none", "long", "near-longest", 4),
    ("supervisor", "8x512", "over", "moderate", "short", "near-longest", 4),
    ("supervisor", "tiny", "tight", "moderate", "medium", "near-longest", 12),
)
"""18 cells, every level of every axis, for both workloads (the numbering of ``--cells``
starts at 1)."""


@dataclass(frozen=True)
class Cell:
    number: int
    workload: str
    model: str
    pool: str
    tenant: str
    waits: str
    context: str
    agents: int

    @property
    def agents_per_workflow(self) -> int:
        return 1 if self.workload == "plain" else 3

    @property
    def turns(self) -> int:
        return bv.PLAIN_TURNS if self.workload == "plain" else 2 * bv.TURNS + 3

    def working_set_blocks(self) -> int:
        """The agents' contexts at their longest, in 32-token blocks, all workflows."""
        tokens = CONTEXT[self.context] + 100 + self.turns * TURN_TOKENS
        per_agent = math.ceil(min(tokens, MAX_MODEL_LEN) / bv.BLOCK_TOKENS)
        return self.agents * self.agents_per_workflow * per_agent

    def blocks(self) -> int:
        """The pool: the working set over its factor, at least one longest request and a
        margin (what vLLM needs to serve one)."""
        least = MAX_MODEL_LEN // bv.BLOCK_TOKENS + 4
        return max(least, round(self.working_set_blocks() / POOL_FACTOR[self.pool]))

    def label(self) -> str:
        return (
            f"{self.number:>2} {self.workload:<10} {self.model:<5} {self.pool:<5} "
            f"tenant {self.tenant:<8} waits {self.waits:<6} ctx {self.context:<12} "
            f"x{self.agents}"
        )


def cells(selected: str | None) -> list[Cell]:
    every = [Cell(i + 1, *row) for i, row in enumerate(CELLS)]
    if not selected:
        return every
    wanted = {int(x) for x in selected.split(",") if x}
    unknown = wanted - {c.number for c in every}
    if unknown:
        raise SystemExit(f"--cells: no cell {sorted(unknown)} (1..{len(every)})")
    return [c for c in every if c.number in wanted]


def configure(cell: Cell) -> None:
    """bench_vllm's workload globals for ``cell``."""
    bv.WORKLOAD = cell.workload
    bv.CONTEXT_TOKENS = CONTEXT[cell.context]
    bv.PLAIN_IO_S = WAITS[cell.waits]
    bv.MAX_MODEL_LEN = MAX_MODEL_LEN
    bv._LEARNING.clear()  # each cell's claimed graphs learn from their own runs


async def run_cell(
    cell: Cell,
    urls: dict[str, str],
    pids: dict[str, int],
    model: str,
    repeats: int,
    out: Any,
    *,
    min_seconds: float = 0.0,
    max_repeats: int = 12,
) -> dict[str, Any]:
    """``repeats`` runs of each set-up, alternating; more (up to ``max_repeats``) until each
    set-up's measured runs add up to ``min_seconds``: a cell of 5-second runs spreads by more
    than the 3% it is judged by, so it gets as many seconds of runs as a slow one."""
    from agentclaims.session.poolshare import PoolShare

    configure(cell)
    rate, tokens = TENANT[cell.tenant]
    lo, hi = WAITS[cell.waits]
    args = argparse.Namespace(
        workflows=cell.agents, churn_rate=rate, churn_tokens=tokens, tool_s=(lo + hi) / 2
    )
    setups = {
        "claims": (urls["gateway"], urls["vllm"], "auto", "without"),
        "stock": (urls["stock_gateway"], urls["stock_vllm"], "off", "with"),
    }
    PoolShare.forget_all()
    # one unmeasured run of each set-up first: vLLM's first pass over new shapes is slow, and
    # what a claimed graph learns in it (its graph, its waits) is what a deployed one knows;
    # waits capped at 2 s so a long-wait cell does not pay its waits twice
    warm = argparse.Namespace(**{**vars(args), "tool_s": min(args.tool_s, 2.0)})
    saved, bv.PLAIN_IO_S = bv.PLAIN_IO_S, (min(lo, 2.0), min(hi, 2.0))
    for gateway, vurl, planner, idle in setups.values():
        with bv.paused(pids[idle]):
            await bv.under_pressure(gateway, vurl, model, planner, f"c{cell.number}w", warm)
    bv.PLAIN_IO_S = saved
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in setups}
    rep = 0
    while rep < repeats or (
        rep < max_repeats
        and min(sum(r["completion_s"] for r in rs) for rs in rows.values()) < min_seconds
    ):
        order = list(setups) if rep % 2 == 0 else list(reversed(setups))
        for name in order:
            gateway, vurl, planner, idle = setups[name]
            with bv.paused(pids[idle]):
                row = await bv.under_pressure(
                    gateway, vurl, model, planner, f"c{cell.number}{name}{rep}", args
                )
            rows[name].append(row)
            record = {"cell": asdict(cell), "setup": name, "run": rep, **row}
            out.write(json.dumps(record) + "\n")
            out.flush()
            print(
                f"cell {cell.number} run {rep} {name}: completion {row['completion_s']} s, "
                f"cached {row['cached_ratio']}",
                file=sys.stderr,
                flush=True,
            )
        rep += 1
    return {name: summary(rs) for name, rs in rows.items()} | {"paired": paired(rows)}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def med(key: str, sub: str | None = None) -> float | None:
        values = [(r.get(key) or {}).get(sub) if sub else r.get(key) for r in rows]
        values = [v for v in values if v is not None]
        return round(statistics.median(values), 4) if values else None

    return {
        "completion_s": med("completion_s"),
        "completion_runs": [r["completion_s"] for r in rows],
        "workflow_p50_s": med("workflow_p50_s"),
        "llm_time_s": med("llm_time_s"),
        "ttft_p50_ms": med("ttft_p50_ms"),
        "ttft_p99_ms": pooled_p99(rows, "ttft_p99_ms"),
        "cached_ratio": med("cached_ratio"),
        "deferrals": med("deferrals"),
        "engine_deferred": med("engine_verdicts", "deferred"),
        "engine_refused": med("engine_verdicts", "refused"),
        "claims_accepted": med("claims_accepted"),
        "preemptions": med("preemptions"),
        "promoted": med("promoted"),
        "other_ttft_p99_ms": pooled_p99(rows, "churn", "p99_ms"),
        "other_prompts": len(_pooled(rows, "churn", "p99_ms") or ()),
        "runs": len(rows),
    }


def pooled_p99(rows: list[dict[str, Any]], key: str, sub: str | None = None) -> float | None:
    """The other tenant's (``churn``) or the agents' TTFT p99 over every run's samples
    pooled (a run of 30 prompts has no p99 of its own: its slowest decides it); runs written
    before the samples were kept give the median of their own p99s."""
    pooled = _pooled(rows, key, sub)
    if pooled is None:  # runs written before the samples were kept
        values = [v for r in rows if (v := _of(r, key, sub).get(sub or key)) is not None]
        return round(statistics.median(values), 4) if values else None
    return round(bv.pct(pooled, 0.99), 1) if pooled else None


def _of(run: dict[str, Any], key: str, sub: str | None) -> dict[str, Any]:
    """Where ``run`` keeps the figures ``pooled_p99`` reads (``run[key]`` with ``sub``)."""
    return (run.get(key) if sub else run) or {}


def _pooled(rows: list[dict[str, Any]], key: str, sub: str | None) -> list[float] | None:
    """Every run's TTFT samples together; ``None`` where a run kept none."""
    samples = [_of(r, key, sub).get("ttfts_ms") for r in rows]
    if any(s is None for s in samples):
        return None
    return [x for s in samples for x in s or ()]


def p99_ratio_interval(
    rows: dict[str, list[dict[str, Any]]], resamples: int = 2000
) -> tuple[float, float] | None:
    """How far chance alone moves the other tenant's pooled TTFT p99 ratio (claims over
    stock): the 5th and 95th percentiles of the ratio over bootstrap resamples of each
    set-up's runs (whole runs: an engine-wide pause stalls every prompt of its run at once,
    so a run's samples are not independent), their samples pooled as ``pooled_p99`` pools
    them. Seeded: the same file gives the same interval. ``None`` where a set-up kept no
    samples."""
    claims, stock = rows.get("claims", []), rows.get("stock", [])
    if not claims or not stock:
        return None
    if not all(_of(r, "churn", "p99_ms").get("ttfts_ms") for r in (*claims, *stock)):
        return None

    def ratio(rng: random.Random) -> float:
        c, k = (
            bv.pct(_pooled(rng.choices(runs, k=len(runs)), "churn", "p99_ms") or [0.0], 0.99)
            for runs in (claims, stock)
        )
        return c / max(k, 1e-9)

    return bootstrap_90(ratio, resamples)


def paired(rows: dict[str, list[dict[str, Any]]]) -> dict[str, float] | None:
    """Each repeat's claims run over the stock run beside it (completion): the median of
    those ratios and their range. Runs side by side share the machine's drift; the median of
    the set-ups' medians does not pair them."""
    ratios = sorted(
        c["completion_s"] / s["completion_s"]
        for c, s in zip(rows.get("claims", []), rows.get("stock", []), strict=False)
        if s["completion_s"]
    )
    if not ratios:
        return None
    return {
        "median": round(statistics.median(ratios), 4),
        "low": round(ratios[0], 4),
        "high": round(ratios[-1], 4),
        "n": len(ratios),
    }


def held_back(summary: dict[str, Any]) -> str:
    """The deferrals column: the sessions' own (their calls held back), then what vLLM's
    connector deferred and refused for held claims, every request's, the other tenant's
    included (runs recorded before it counted them: the sessions' only)."""
    if summary.get("engine_deferred") is None:
        return str(summary["deferrals"])
    return (
        f"{summary['deferrals']} (engine: {summary['engine_deferred']} deferred, "
        f"{summary['engine_refused']} refused)"
    )


def report(cell: Cell, blocks: int, result: dict[str, Any]) -> str:
    c, s = result["claims"], result["stock"]
    ratio = c["completion_s"] / s["completion_s"] if s["completion_s"] else float("nan")
    llm = s["llm_time_s"] / c["llm_time_s"] if c["llm_time_s"] else float("nan")
    other = (
        c["other_ttft_p99_ms"] / s["other_ttft_p99_ms"]
        if c["other_ttft_p99_ms"] and s["other_ttft_p99_ms"]
        else None
    )
    pair = result.get("paired") or {}
    spread = (
        f" (paired: median {pair['median']:.3f}x, {pair['low']:.3f}-{pair['high']:.3f}x over "
        f"{pair['n']})"
        if pair
        else ""
    )
    return (
        f"{cell.label()} | {blocks:>4} blocks (ws {cell.working_set_blocks()}) | completion "
        f"{c['completion_s']:.2f} vs {s['completion_s']:.2f} s = {ratio:.3f}x{spread} | LLM time "
        f"{llm:.2f}x lower | TTFT p50 {c['ttft_p50_ms']} vs {s['ttft_p50_ms']} ms, p99 "
        f"{c['ttft_p99_ms']} vs {s['ttft_p99_ms']} | cached {c['cached_ratio']} vs "
        f"{s['cached_ratio']} | deferrals {held_back(c)} | other TTFT p99 "
        f"{c['other_ttft_p99_ms']} vs {s['other_ttft_p99_ms']} ms"
        + (f" ({other:.2f}x)" if other else "")
        + f" | vLLM preempted {c['preemptions']} vs {s['preemptions']} | promoted "
        f"{c['promoted']}"
    )


def summarize(path: str) -> None:
    """The markdown table of the runs in ``path`` (``--out``): per cell, the medians of each
    set-up's runs, and the ratios the goals are stated in."""
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {}
    shapes: dict[int, Cell] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            record = json.loads(line)
            cell = Cell(**record["cell"])
            shapes[cell.number] = cell
            runs.setdefault(cell.number, {}).setdefault(record["setup"], []).append(record)
    print(
        "| cell | pool blocks (working set) | completion claims / stock (ratio) "
        "| paired ratios: median (range) | workflow p50 "
        "| LLM-call time, x lower | TTFT p50 / p99 ms | cached | deferrals "
        "| other tenant TTFT p99 ms (ratio), of its prompts | runs |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for number in sorted(runs):
        cell, both = shapes[number], runs[number]
        if "claims" not in both or "stock" not in both:
            continue
        c, k = summary(both["claims"]), summary(both["stock"])
        ratio = c["completion_s"] / k["completion_s"]
        pair = paired(both)
        spread = f"{pair['median']:.3f}x ({pair['low']:.3f}-{pair['high']:.3f})" if pair else "none"
        llm = k["llm_time_s"] / c["llm_time_s"] if c["llm_time_s"] else float("nan")
        chance = p99_ratio_interval(both)
        other = (
            f"{c['other_ttft_p99_ms']} / {k['other_ttft_p99_ms']} "
            f"({c['other_ttft_p99_ms'] / k['other_ttft_p99_ms']:.2f}x"
            + (f"; 90% {chance[0]:.2f}-{chance[1]:.2f}x" if chance else "")
            + ")"
            # the p99 of few prompts is one of their slowest few: how many it rests on
            + (f", of {c['other_prompts']} / {k['other_prompts']}" if c["other_prompts"] else "")
            if c["other_ttft_p99_ms"] and k["other_ttft_p99_ms"]
            else "none"
        )
        label = (
            f"{cell.number}: {cell.workload}, {cell.model}, {cell.pool}, tenant {cell.tenant}, "
            f"waits {cell.waits}, ctx {cell.context}, x{cell.agents}"
        )
        print(
            f"| {label} | {cell.blocks()} ({cell.working_set_blocks()}) | "
            f"{c['completion_s']:.2f} / {k['completion_s']:.2f} (**{ratio:.3f}x**) | {spread} | "
            f"{c['workflow_p50_s']} / {k['workflow_p50_s']} | {llm:.2f}x | "
            f"{c['ttft_p50_ms']} / {c['ttft_p99_ms']} vs {k['ttft_p50_ms']} / {k['ttft_p99_ms']} | "
            f"{c['cached_ratio']} vs {k['cached_ratio']} | {held_back(c)} | {other} | "
            f"{len(both['claims'])} + {len(both['stock'])} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cells", default=None, help="comma-separated cell numbers (all)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each set-up per cell")
    parser.add_argument(
        "--min-seconds",
        type=float,
        default=0.0,
        help="more runs of a cell (up to --max-repeats) until each set-up's add up to this",
    )
    parser.add_argument("--max-repeats", type=int, default=12, help="with --min-seconds")
    parser.add_argument("--layout", choices=("pinned", "shared"), default="pinned")
    parser.add_argument(
        "--promote",
        type=int,
        default=None,
        help="the gateways' --promote: workflow calls ahead in vLLM's queue at once (theirs)",
    )
    parser.add_argument(
        "--promote-share",
        type=float,
        default=None,
        help="the gateways' --promote-share: the share of each second promoted calls may "
        "put the calls they overtake back by (theirs)",
    )
    parser.add_argument("--out", default="bench-matrix.jsonl", help="every run's figures")
    parser.add_argument("--list", action="store_true", help="print the cells and exit")
    parser.add_argument(
        "--summarize",
        metavar="JSONL",
        default=None,
        help="print the table (markdown) of the runs an --out file holds, and exit",
    )
    args = parser.parse_args()
    if args.summarize:
        summarize(args.summarize)
        return
    chosen = cells(args.cells)
    bv.PROMOTE = args.promote
    bv.PROMOTE_SHARE = args.promote_share
    if args.list:
        for cell in chosen:
            print(f"{cell.label()} | {cell.blocks()} blocks (ws {cell.working_set_blocks()})")
        return
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    on_vllm, on_gateway = bv.layout(args.layout)
    bv.MAX_MODEL_LEN = MAX_MODEL_LEN
    models: dict[str, str] = {}
    lines: list[str] = []
    started = time.monotonic()
    with open(args.out, "a", encoding="utf-8") as out:
        for cell in chosen:
            if cell.model not in models:
                models[cell.model] = bv.tiny_model(*MODELS[cell.model])
            blocks = cell.blocks()
            procs: list[subprocess.Popen[bytes]] = []
            try:
                urls, pids = bv.start_servers(
                    procs, models[cell.model], blocks, on_vllm, on_gateway
                )
                result = asyncio.run(
                    run_cell(
                        cell,
                        urls,
                        pids,
                        models[cell.model],
                        args.repeats,
                        out,
                        min_seconds=args.min_seconds,
                        max_repeats=max(args.repeats, args.max_repeats),
                    )
                )
                line = report(cell, blocks, result)
            except (Exception, SystemExit) as exc:  # one cell's failure (a server that did
                # not start: SystemExit) is reported, and the matrix goes on
                line = f"{cell.label()} | failed: {type(exc).__name__}: {str(exc)[:200]}"
            finally:
                for proc in reversed(procs):
                    bv.stop(proc, group=True, timeout_s=30)
            lines.append(line)
            print(line, flush=True)
    layout = "pinned" if on_vllm else "shared"
    print(
        f"\n{len(lines)} cells, layout {layout}, medians of {args.repeats} runs each or more "
        f"(to {args.min_seconds:g} s of runs, at most {args.max_repeats}) "
        f"(claims / stock, alternating), {time.monotonic() - started:.0f} s in all"
    )
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
