"""What one read of vLLM's queue histograms costs vLLM: the CPU its API server spends
answering the gateway's read (``EngineQueue``: the four series, prometheus_client's
``name[]`` filter at ``/metrics/``) beside a read of the whole ``/metrics`` page, on one
vLLM with the tiny model after a few calls. Rounds alternate the two, 50 reads each; the
API server's CPU-time clock is read around them. A script that prints figures::

    .venv/bin/python benchmarks/bench_metrics_read.py [--rounds 3]

(needs the vLLM environment: `make vllm-env`).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx2

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gateway_latency import process_cpu_s
from bench_vllm import KEY, layout, serve_vllm, tiny_model
from servers import free_port, stop

from agentclaims.vllm.engine_queue import PAGE, PATH

READS = 50


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    port = free_port()
    on_vllm, _ = layout("pinned")
    proc = serve_vllm(tiny_model(), port, "--claims-key", KEY, on=on_vllm)
    try:
        # vLLM's API server: the process that names the port (the engine core does not)
        found = subprocess.run(
            ["pgrep", "-f", "--", f"port {port}"], capture_output=True, text=True, check=False
        )
        pids = [int(pid) for pid in found.stdout.split()]
        cpu: dict[str, list[float]] = {PAGE: [], PATH: []}
        size: dict[str, int] = {}
        with httpx2.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            model = http.get("/v1/models").json()["data"][0]["id"]
            for _ in range(3):  # requests scheduled: the histograms have samples
                http.post("/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 4})
            for _ in range(args.rounds):
                for path in (PAGE, PATH):
                    before = {pid: process_cpu_s(pid) for pid in pids}
                    for _ in range(READS):
                        answer = http.get(path)
                        answer.raise_for_status()
                    size[path] = len(answer.content)
                    spent = max(process_cpu_s(pid) - before[pid] for pid in pids)
                    cpu[path].append(spent / READS * 1e3)
                time.sleep(0.1)
    finally:
        stop(proc, group=True, timeout_s=30)
    for path, name in ((PAGE, "whole page"), (PATH, "four series")):
        runs = ", ".join(f"{ms:.2f}" for ms in cpu[path])
        print(
            f"{name:12} {size[path]:>7} bytes  vLLM API server CPU per read: "
            f"median {statistics.median(cpu[path]):.2f} ms (rounds {runs})"
        )
    print(f"ratio: {statistics.median(cpu[PAGE]) / statistics.median(cpu[PATH]):.1f}x")


if __name__ == "__main__":
    main()
