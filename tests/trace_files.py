"""Trace files for the replay's tests: small, well-formed, written where a test wants them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def write_trace(path: Path, trace_id: str, n: int = 3) -> None:
    """A small well-formed trace file: a tool loop whose context grows by one block a turn."""
    requests = [
        {
            "t": 10.0 * i,
            "type": "n",
            "model": "m",
            "in": 64 * (2 + i),
            "out": 10,
            "hash_ids": list(range(1, 3 + i)),
            "input_types": ["tool_result"],
            "output_types": ["tool_use"],
            "stop": "tool_use",
            "api_time": 1.0,
            "think_time": 9.0 if i else 0.0,
        }
        for i in range(n)
    ]
    data = {"id": trace_id, "block_size": 64, "hash_id_scope": "local", "requests": requests}
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as fh:
        json.dump(data, fh)
