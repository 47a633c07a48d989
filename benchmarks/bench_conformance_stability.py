"""Whether the conformance suite on a real vLLM gives the same statuses run after run on a busy
machine. A script that prints what it saw; no test times anything.

One vLLM with the connector (the tiny model, the tests' 41-block pool, ``--max-ttl-s 120
--max-defer-s 10``) and a gateway in front of it. With ``--load`` (the default) one busy-loop
process per core runs the whole time, so vLLM, the gateway and the suite compete for the CPU.
``--runs`` times, ``agentclaims conformance --backend GATEWAY --json``; per run the status of
every level and its time, then whether every run gave the first run's statuses. Run::

    .venv/bin/python benchmarks/bench_conformance_stability.py [--runs 10] [--no-load] [--json]

(needs the vLLM environment: `make vllm-env`).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vllm import cli, start, tiny_model
from servers import free_port, stop

KEY = "stability-claims-key"
SERVER = ("--max-ttl-s", "120", "--max-defer-s", "10", "--dev-mode")


def _spin() -> None:  # pragma: no cover - a load generator
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--no-load", dest="load", action="store_false", help="a quiet machine")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    model = tiny_model()
    ports = {"vllm": free_port(), "gateway": free_port()}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    events = f"ipc:///tmp/agentclaims-stability-{os.getpid()}.kv"
    procs: list[subprocess.Popen[bytes]] = []
    spinners: list[multiprocessing.Process] = []
    runs: list[dict[str, Any]] = []
    try:
        argv = cli("vllm", "serve", "--model", model, "--port", str(ports["vllm"]))
        argv += ["--claims-key", KEY, "--kv-events", events, *SERVER]
        procs.append(start(argv, urls["vllm"]))
        gateway = cli("serve", "--port", str(ports["gateway"]), "--kv", "vllm")
        gateway += ["--upstream", urls["vllm"], "--claims-key", KEY, "--kv-events", events]
        procs.append(start(gateway, urls["gateway"]))
        if args.load:
            for _ in range(os.cpu_count() or 1):
                spinner = multiprocessing.Process(target=_spin, daemon=True)
                spinner.start()
                spinners.append(spinner)
        for i in range(args.runs):
            began = time.monotonic()
            done = subprocess.run(
                cli("conformance", "--backend", urls["gateway"], "--json"),
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
            )
            if done.returncode not in (0, 1):
                raise SystemExit(f"run {i}: conformance exited {done.returncode}: {done.stderr}")
            levels = json.loads(done.stdout)["levels"]
            runs.append(
                {
                    "status": {name: level["status"] for name, level in levels.items()},
                    "detail": {name: level.get("detail", "") for name, level in levels.items()},
                    "seconds": round(time.monotonic() - began, 1),
                }
            )
            if not args.json:
                row = " ".join(f"{k}={v}" for k, v in runs[-1]["status"].items())
                print(f"run {i + 1:2d} ({runs[-1]['seconds']:5.1f} s): {row}", flush=True)
    finally:
        for spinner in spinners:
            spinner.terminate()
        for proc in reversed(procs):
            stop(proc, group=True, timeout_s=30)
    first = runs[0]["status"]
    differing = [i + 1 for i, run in enumerate(runs) if run["status"] != first]
    summary = {"load": args.load, "runs": runs, "same_statuses": not differing}
    if args.json:
        print(json.dumps(summary))
        return
    print(
        f"{len(runs)} runs{' with both cores loaded' if args.load else ''}: "
        + ("every run gave the same statuses" if not differing else f"runs {differing} differ")
    )
    for i in differing:
        for level, status in runs[i - 1]["status"].items():
            if status != first[level]:
                print(f"  run {i} {level} {status}: {runs[i - 1]['detail'][level]}")


if __name__ == "__main__":
    main()
