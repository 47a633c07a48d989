"""Same as ``agentclaims bench engine``: ``python benchmarks/bench_engine.py [--json] [--quick]``."""

from __future__ import annotations

import sys

from agentclaims.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["bench", "engine", *sys.argv[1:]]))
