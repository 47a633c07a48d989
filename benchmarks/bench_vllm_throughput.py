"""What the agentclaims connector costs vLLM's throughput with no claim held, resolved against
the difference between two vLLM instances (a script that prints figures; no test times it).

One pair of servers differs by more than the goal (2%) whatever they run: placement, memory and
the machine's other load make one instance faster than its twin. So this runs three pairs of
fresh servers, each measured in 12 alternating rounds (the other server paused meanwhile):

    connector, stock     the connector's server started first
    stock, connector     the stock server started first
    stock, stock         the control: two identical stock servers

and reports, per pair, tokens per second and tokens per CPU second of each server's processes
(medians, and the median of the per-round ratios), then the connector's cost over both start
orders (the geometric mean of the two ratios) next to the control's difference. Run::

    .venv/bin/python benchmarks/bench_vllm_throughput.py [--rounds 12] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from bench_vllm import KEY, SERVER, cli, start, throughput, tiny_model
from servers import free_port, stop

PAIRS = {
    "connector, stock": (("--claims-key", KEY), ("--no-connector",)),
    "stock, connector": (("--no-connector",), ("--claims-key", KEY)),
    "stock, stock": (("--no-connector",), ("--no-connector",)),
}


def pair(model: str, first: tuple[str, ...], second: tuple[str, ...], rounds: int) -> Any:
    """Two fresh servers, ``first`` started first; ``throughput`` with ``with`` = first."""
    procs = []
    try:
        urls = []
        for extra in (first, second):
            port = free_port()
            urls.append(f"http://127.0.0.1:{port}")
            argv = cli("vllm", "serve", "--model", model, "--port", str(port))
            procs.append(start([*argv, *SERVER, *extra], urls[-1]))
        sessions = {"with": procs[0].pid, "without": procs[1].pid}
        return asyncio.run(throughput(urls[0], urls[1], model, rounds, sessions))
    finally:
        for proc in procs:
            stop(proc, group=True, timeout_s=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    model = tiny_model()
    out: dict[str, Any] = {name: pair(model, *sides, args.rounds) for name, sides in PAIRS.items()}
    # connector / stock in each start order: first / second, then second / first inverted
    for key in ("ratio", "cpu_ratio"):
        both = out["connector, stock"][key] / out["stock, connector"][key]
        out[f"connector_cost_{key}"] = round(math.sqrt(both), 4)
    if args.json:
        print(json.dumps(out))
        return
    print(f"{args.rounds} alternating rounds per pair\n")
    for name in PAIRS:
        r = out[name]
        print(
            f"{name:18} {r['connector_tok_s']:>8} vs {r['stock_tok_s']:>8} tok/s, ratio "
            f"{r['ratio']:.4f}; per CPU second {r['connector_tok_per_cpu_s']} vs "
            f"{r['stock_tok_per_cpu_s']}, ratio {r['cpu_ratio']:.4f}"
        )
    cost, cpu = out["connector_cost_ratio"], out["connector_cost_cpu_ratio"]
    control = out["stock, stock"]
    print(
        f"\nconnector / stock over both start orders: {cost:.4f} ({(cost - 1) * 100:+.1f}%) "
        f"tok/s, {cpu:.4f} ({(cpu - 1) * 100:+.1f}%) per CPU second (goal >= -2%); "
        f"two identical stock servers: {(control['ratio'] - 1) * 100:+.1f}% "
        f"({(control['cpu_ratio'] - 1) * 100:+.1f}% per CPU second)"
    )


if __name__ == "__main__":
    main()
