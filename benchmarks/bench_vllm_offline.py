"""What the agentclaims connector costs vLLM's engine with no claim held, over many fresh
engine pairs (a script that prints figures; no test times it).

Two vLLM instances differ by more than the goal (2%) whatever they run, so one pair cannot show
it. This measures vLLM's own offline engine (``vllm.LLM``: its scheduler, block pool and model
runner, with the connector and the refusing scheduler loaded through vLLM's own config, as
``agentclaims vllm serve`` loads them), each engine in a worker process of its own that starts in
seconds. Without the HTTP server and its process hops an engine step is shorter, so the
connector's per-step work weighs more here than behind the server: an upper bound on its cost.

For each of ``--pairs`` fresh pairs (the start order drawn at random) the two engines take turns
for ``--rounds`` rounds (8 sequences, 128 tokens each, the same prompts for both; the order
alternates every round; the waiting one is blocked on its pipe, using no CPU). The pair's ratio
is the median of its per-round ratios (connector / stock, tokens per second and tokens per CPU
second of the worker); the cost is the geometric mean over pairs, with a 95% interval over pairs.
``--control`` pairs of two stock engines, measured the same way, show what two identical
engines differ by. Run::

    .venv/bin/python benchmarks/bench_vllm_offline.py --model DIR [--pairs 12] [--json]

(``DIR`` from ``agentclaims vllm tiny-model DIR``; the workers run in vLLM's environment,
``$AGENTCLAIMS_VLLM_PYTHON`` or ``.venv-vllm``.)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SEQUENCES, PROMPT_TOKENS, MAX_TOKENS = 8, 40, 128
KEY = "bench-claims-key"


# ---------------------------------------------------------------------------- the worker
def worker(model: str, kind: str, loading: dict[str, Any]) -> None:
    """One engine (``connector`` or ``stock``; ``loading``: the connector's
    ``kv_transfer_config`` and the scheduler class, as ``agentclaims vllm serve`` passes them):
    ``ready`` once warm, then one round per ``run N`` line on stdin, answered with
    ``{"tok_s": ..., "tok_cpu_s": ...}``."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    options: dict[str, Any] = {
        "model": model,
        "dtype": "bfloat16",
        "max_model_len": 1024,
        "max_num_seqs": SEQUENCES,
        "max_num_batched_tokens": 512,
        "enable_prefix_caching": True,
        "block_size": 32,
        "num_gpu_blocks_override": 97,
        "gpu_memory_utilization": 0.1,
        "enforce_eager": True,
        "distributed_executor_backend": "uni",
    }
    if kind == "connector":
        options["kv_transfer_config"] = KVTransferConfig(**loading["kv_transfer_config"])
        options["scheduler_cls"] = loading["scheduler_cls"]
    llm = LLM(**options)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)

    def one_round(r: int) -> dict[str, float]:
        prompts = [
            {"prompt_token_ids": [(r * 131 + i * 7 + j) % 500 + 3 for j in range(PROMPT_TOKENS)]}
            for i in range(SEQUENCES)
        ]
        c0, t0 = time.process_time(), time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        return {"tok_s": tokens / wall, "tok_cpu_s": tokens / cpu}

    one_round(-1)  # warm-up
    print("ready", flush=True)
    for line in sys.stdin:
        command, _, arg = line.strip().partition(" ")
        if command != "run":
            break
        print(json.dumps(one_round(int(arg))), flush=True)


# ---------------------------------------------------------------------------- the driver
class Engine:
    """A worker process, spoken to over its pipes."""

    def __init__(self, python: str, model: str, kind: str) -> None:
        from agentclaims.vllm.launch import CONNECTOR, SCHEDULER

        extra = {"claims_key": KEY, "max_ttl_s": 600.0, "max_defer_s": 30.0}
        loading = {
            "kv_transfer_config": {**CONNECTOR, "kv_connector_extra_config": extra},
            "scheduler_cls": SCHEDULER,
        }
        self.kind = kind
        self.proc = subprocess.Popen(
            [
                python,
                __file__,
                "--worker",
                kind,
                "--model",
                model,
                "--loading",
                json.dumps(loading),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )

    def ready(self, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip() == "ready":
                return
            if time.monotonic() > deadline:
                break
        raise SystemExit(f"the {self.kind} engine did not start (rc {self.proc.poll()})")

    def run(self, r: int) -> dict[str, float]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(f"run {r}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the {self.kind} engine died (rc {self.proc.poll()})")
        result: dict[str, float] = json.loads(line)
        return result

    def stop(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (subprocess.TimeoutExpired, OSError):
            self.proc.kill()
            self.proc.wait()


def pair(python: str, model: str, kinds: tuple[str, str], rounds: int) -> dict[str, Any]:
    """Two fresh engines started in the order ``kinds``, ``rounds`` alternating rounds. The
    ratios are connector / stock in a pair with the connector, second / first in a control."""
    engines = [Engine(python, model, kind) for kind in kinds]
    try:
        for engine in engines:
            engine.ready()
        per: list[list[dict[str, float]]] = [[], []]
        for r in range(rounds):
            order = (0, 1) if r % 2 == 0 else (1, 0)
            for i in order:
                per[i].append(engines[i].run(r))
    finally:
        for engine in engines:
            engine.stop()
    a, b = (1, 0) if kinds == ("connector", "stock") else (0, 1)
    out: dict[str, Any] = {"started": list(kinds)}
    for key in ("tok_s", "tok_cpu_s"):
        ratios = [y[key] / x[key] for x, y in zip(per[a], per[b], strict=True)]
        out[f"{key}_ratio"] = statistics.median(ratios)
        out[f"{key}_medians"] = [round(statistics.median(p[key] for p in per[i])) for i in (a, b)]
    return out


def summary(ratios: list[float]) -> dict[str, float]:
    """Geometric mean of ``ratios`` and a 95% interval over them (t on the log ratios)."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    half = 0.0
    if len(logs) > 1:
        t95 = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36, 9: 2.31, 10: 2.26}
        t = t95.get(len(logs), 2.2 if len(logs) < 13 else 2.1 if len(logs) < 21 else 2.0)
        half = t * statistics.stdev(logs) / math.sqrt(len(logs))
    return {
        "ratio": round(math.exp(mean), 4),
        "low": round(math.exp(mean - half), 4),
        "high": round(math.exp(mean + half), 4),
        "pairs": len(ratios),
    }


def vllm_python() -> str:
    explicit = os.environ.get("AGENTCLAIMS_VLLM_PYTHON")
    if explicit:
        return explicit
    local = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"
    if local.exists():
        return str(local)
    raise SystemExit("no vLLM environment: set AGENTCLAIMS_VLLM_PYTHON (make vllm-env builds one)")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--model", required=True, help="a model folder (agentclaims vllm tiny-model)"
    )
    parser.add_argument("--pairs", type=int, default=12, help="fresh connector/stock pairs")
    parser.add_argument("--control", type=int, default=6, help="fresh stock/stock pairs")
    parser.add_argument("--rounds", type=int, default=30, help="rounds per engine and pair")
    parser.add_argument("--seed", type=int, default=0, help="draws the start orders")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", choices=("connector", "stock"), help=argparse.SUPPRESS)
    parser.add_argument("--loading", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.model, args.worker, json.loads(args.loading))
        return
    if min(args.pairs, args.rounds) < 1 or args.control < 0:
        parser.error("--pairs and --rounds must be >= 1, --control >= 0")
    python = vllm_python()
    rng = random.Random(args.seed)
    plan: list[tuple[str, str]] = [
        ("connector", "stock") if rng.random() < 0.5 else ("stock", "connector")
        for _ in range(args.pairs)
    ] + [("stock", "stock")] * args.control
    rng.shuffle(plan)  # controls spread over the run, not all at its end
    results = []
    for i, kinds in enumerate(plan, 1):
        results.append(pair(python, args.model, kinds, args.rounds))
        print(f"pair {i}/{len(plan)} {kinds}: {results[-1]['tok_s_ratio']:.4f}", file=sys.stderr)
    connector = [r for r in results if "connector" in r["started"]]
    control = [r for r in results if "connector" not in r["started"]]
    out: dict[str, Any] = {"rounds": args.rounds, "pairs": results}
    for name, rows in (("connector", connector), ("control", control)):
        if rows:
            out[name] = {
                key: summary([r[f"{key}_ratio"] for r in rows]) for key in ("tok_s", "tok_cpu_s")
            }
    if args.json:
        print(json.dumps(out))
        return
    print(
        f"{len(connector)} connector/stock pairs, {len(control)} stock/stock pairs, "
        f"{args.rounds} alternating rounds each; ratio = geometric mean over pairs [95% interval]"
    )
    for name, label in (("connector", "connector / stock"), ("control", "stock / stock (A/A)")):
        if name in out:
            s, c = out[name]["tok_s"], out[name]["tok_cpu_s"]
            print(
                f"  {label:20} tokens/s {s['ratio']:.4f} [{s['low']:.4f}, {s['high']:.4f}]   "
                f"tokens/CPU-s {c['ratio']:.4f} [{c['low']:.4f}, {c['high']:.4f}]"
            )


if __name__ == "__main__":
    main()
