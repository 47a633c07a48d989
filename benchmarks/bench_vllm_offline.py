"""What the agentclaims connector costs vLLM's engine with no claim held, over many fresh
engine pairs (a script that prints figures; no test times it).

Two vLLM instances differ by more than the goal (2%) whatever they run, so one pair cannot show
it. This measures vLLM's own offline engine (``vllm.LLM``: its scheduler, block pool and model
runner, with the connector and the refusing scheduler loaded through vLLM's own config, as
``agentclaims vllm serve`` loads them), each engine in a worker process of its own that starts in
seconds. Without the HTTP server and its process hops an engine step is shorter, so the
connector's per-step work weighs more here than behind the server: an upper bound on its cost.

For each of ``--pairs`` fresh pairs (half start the connector's engine first, half second, in a
random order with the controls) the two engines take turns
for ``--rounds`` rounds (8 sequences, 128 tokens each, the same prompts for both; the order
alternates every round; the waiting one is blocked on its pipe, using no CPU). The pair's ratio
is the median of its per-round ratios (connector / stock, tokens per second and tokens per CPU
second of the worker). The cost is the geometric mean over pairs with a 95% interval, and again
with the start order taken out (the engine started second tends to be faster: the mean of the
two orders' means). ``--control`` pairs of two stock engines, measured the same way, show what
two identical engines differ by. ``--from-json`` pools the pairs of earlier runs.
``--profile SECONDS`` instead samples one connector engine with py-spy and prints the share of
its time in the connector's code and in vLLM's machinery for connectors (the attention layers
and the scheduler update those wrap are vLLM's own work and not counted). Run::

    .venv/bin/python benchmarks/bench_vllm_offline.py [--model DIR] [--pairs 12] [--json]

(without ``--model``, a fresh tiny model, as ``agentclaims vllm tiny-model DIR`` builds; the
workers run in vLLM's environment, ``$AGENTCLAIMS_VLLM_PYTHON`` or ``.venv-vllm``.)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SEQUENCES, PROMPT_TOKENS, MAX_TOKENS = 8, 40, 128


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
        from bench_vllm import KEY

        from agentclaims.vllm.launch import SCHEDULER, connector_config

        loading = {"kv_transfer_config": connector_config(KEY), "scheduler_cls": SCHEDULER}
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


_T95 = (12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23, 2.20, 2.18, 2.16, 2.14, 2.13)


def _t95(df: int) -> float:
    """Two-sided 95% quantile of Student's t with ``df`` degrees of freedom."""
    return _T95[df - 1] if df <= len(_T95) else 2.12 if df < 20 else 2.09 if df < 30 else 2.04


def _interval(mean: float, half: float, pairs: int) -> dict[str, float]:
    return {
        "ratio": round(math.exp(mean), 4),
        "low": round(math.exp(mean - half), 4),
        "high": round(math.exp(mean + half), 4),
        "pairs": pairs,
    }


def summary(ratios: list[float]) -> dict[str, float]:
    """Geometric mean of ``ratios`` and a 95% interval over them (t on the log ratios)."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    half = (
        _t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
        if len(logs) > 1
        else 0.0
    )
    return _interval(mean, half, len(logs))


def balanced(first: list[float], second: list[float]) -> dict[str, float] | None:
    """The connector's effect with the start order taken out: the mean of the two orders'
    mean log ratios (``first``: pairs that started the connector's engine first), with a 95%
    interval from the spread within each order. ``None`` below two pairs of each order."""
    if min(len(first), len(second)) < 2:
        return None
    logs = [[math.log(r) for r in group] for group in (first, second)]
    mean = (statistics.fmean(logs[0]) + statistics.fmean(logs[1])) / 2
    se = 0.5 * math.sqrt(sum(statistics.variance(g) / len(g) for g in logs))
    half = _t95(len(first) + len(second) - 2) * se
    return _interval(mean, half, len(first) + len(second))


def analyse(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """Every figure of a run (or of several runs' pairs pooled)."""
    out: dict[str, Any] = {}
    groups = {
        "connector_first": [p for p in pairs if p["started"] == ["connector", "stock"]],
        "connector_second": [p for p in pairs if p["started"] == ["stock", "connector"]],
        "control": [p for p in pairs if p["started"] == ["stock", "stock"]],
    }
    for key in ("tok_s", "tok_cpu_s"):
        ratios = {name: [p[f"{key}_ratio"] for p in rows] for name, rows in groups.items()}
        both = ratios["connector_first"] + ratios["connector_second"]
        out[key] = {
            "connector": summary(both) if both else None,
            "connector_order_balanced": balanced(
                ratios["connector_first"], ratios["connector_second"]
            ),
            "control": summary(ratios["control"]) if ratios["control"] else None,
            "median_pair": round(statistics.median(both), 4) if both else None,
        }
    return out


# Frames of the connector's code and of vLLM's machinery for connectors (none of it runs
# without one); and the vLLM work two of them wrap, which runs with or without a connector.
CONNECTOR_FRAMES = ("agentclaims_vllm/", "kv_connector", "kv_transfer")
WRAPPED_WORK = ("unified_attention", "Scheduler.update_from_output")


def profile(python: str, model: str, seconds: int) -> dict[str, Any]:
    """py-spy on one connector engine while it runs rounds: the share of its samples spent in
    the connector's code and vLLM's connector machinery (the attention and the scheduler
    update those wrap excluded), and the largest of those frames."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        raise SystemExit("--profile needs py-spy (the dev extra installs it)")
    engine = Engine(python, model, "connector")
    raw = Path(tempfile.mkdtemp(prefix="bench-offline-")) / "samples.txt"
    try:
        engine.ready()
        argv = [spy, "record", "-p", str(engine.proc.pid), "-r", "250", "-d", str(seconds)]
        recorder = subprocess.Popen(
            [*argv, "-f", "raw", "-o", str(raw), "--nonblocking"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        r = 0
        while recorder.poll() is None:
            engine.run(r)
            r += 1
    finally:
        engine.stop()
    total, attributed = 0, 0
    frames: dict[str, int] = {}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        total += n
        names = stack.split(";")
        ours = [i for i, f in enumerate(names) if any(k in f for k in CONNECTOR_FRAMES)]
        if not ours:
            continue
        below = names[ours[-1] + 1 :]
        if any(w in f for f in below for w in WRAPPED_WORK):
            continue  # vLLM's own work, called through a connector wrapper
        attributed += n
        top = names[ours[0]].split(" (")[0]
        frames[top] = frames.get(top, 0) + n
    if not total:
        raise SystemExit("py-spy took no samples")
    largest = sorted(frames.items(), key=lambda kv: -kv[1])[:5]
    return {
        "samples": total,
        "rounds": r,
        "connector_share": round(attributed / total, 4),
        "frames": {name: round(n / total, 4) for name, n in largest},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--model", help="a model folder (default: a fresh tiny model, as the tests use)"
    )
    parser.add_argument("--pairs", type=int, default=12, help="fresh connector/stock pairs")
    parser.add_argument("--control", type=int, default=6, help="fresh stock/stock pairs")
    parser.add_argument("--rounds", type=int, default=30, help="rounds per engine and pair")
    parser.add_argument("--seed", type=int, default=0, help="draws the start orders")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--profile",
        type=int,
        metavar="SECONDS",
        help="instead: py-spy one connector engine this long, print its connector share",
    )
    parser.add_argument(
        "--from-json", nargs="+", metavar="FILE", help="report the pairs of earlier --json runs"
    )
    parser.add_argument("--worker", choices=("connector", "stock"), help=argparse.SUPPRESS)
    parser.add_argument("--loading", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.model, args.worker, json.loads(args.loading))
        return
    if min(args.pairs, args.rounds) < 1 or args.control < 0:
        parser.error("--pairs and --rounds must be >= 1, --control >= 0")
    if args.from_json:
        pairs_done = [p for f in args.from_json for p in json.loads(Path(f).read_text())["pairs"]]
        report(pairs_done, args)
        return
    from bench_vllm import tiny_model

    from agentclaims.errors import UsageError
    from agentclaims.vllm.launch import vllm_python

    try:
        python = vllm_python()
    except UsageError as exc:
        raise SystemExit(f"bench_vllm_offline: {exc}") from None
    args.model = args.model or tiny_model()
    if args.profile:
        found = profile(python, args.model, args.profile)
        if args.json:
            print(json.dumps(found))
            return
        print(
            f"{found['samples']:,} samples over {found['rounds']} rounds: "
            f"{found['connector_share']:.2%} in the connector and vLLM's connector machinery"
        )
        for name, share in found["frames"].items():
            print(f"  {share:6.2%}  {name}")
        return
    rng = random.Random(args.seed)
    orders = [("connector", "stock"), ("stock", "connector")] * (args.pairs // 2)
    if args.pairs % 2:
        orders.append(rng.choice([("connector", "stock"), ("stock", "connector")]))
    plan = orders + [("stock", "stock")] * args.control
    rng.shuffle(plan)  # both orders and the controls spread over the run
    results = []
    for i, kinds in enumerate(plan, 1):
        results.append(pair(python, args.model, kinds, args.rounds))
        print(f"pair {i}/{len(plan)} {kinds}: {results[-1]['tok_s_ratio']:.4f}", file=sys.stderr)
    report(results, args)


def report(results: list[dict[str, Any]], args: Any) -> None:
    out: dict[str, Any] = {"rounds": args.rounds, "pairs": results, **analyse(results)}
    if args.json:
        print(json.dumps(out))
        return
    rows = {
        n: sum(1 for r in results if ("connector" in r["started"]) == c)
        for n, c in (("connector", True), ("control", False))
    }
    print(
        f"{rows['connector']} connector/stock pairs (both start orders), {rows['control']} "
        f"stock/stock pairs; ratio [95% interval] over pairs"
    )
    labels = (
        ("connector", "connector / stock"),
        ("connector_order_balanced", "  start order out"),
        ("control", "stock / stock (A/A)"),
    )
    for name, label in labels:
        s, c = out["tok_s"][name], out["tok_cpu_s"][name]
        if s is None:
            continue
        print(
            f"  {label:20} tokens/s {s['ratio']:.4f} [{s['low']:.4f}, {s['high']:.4f}]   "
            f"tokens/CPU-s {c['ratio']:.4f} [{c['low']:.4f}, {c['high']:.4f}]"
        )
    print(f"  median pair: {out['tok_s']['median_pair']} (tokens/s)")


if __name__ == "__main__":
    main()
