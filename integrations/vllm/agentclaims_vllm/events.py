"""Relay vLLM's ZMQ KV events to the gateway as JSON lines (run in the vLLM environment).

vLLM publishes its block pool's events with ``--kv-events-config`` (a ZMQ PUB socket, frames
``[topic, seq (8 bytes, big-endian), msgpack batch]``, and a ROUTER replay socket that resends
buffered batches from a sequence number, ending with seq -1). The gateway's core stays free of
ZMQ and msgpack: it starts this relay from the vLLM environment (which has both) and reads one
JSON object per batch from its stdout::

    python -m agentclaims_vllm.events ipc:///tmp/x.kv [--replay ipc:///tmp/x.kv-replay]

    {"seq": 7, "ts": 1764.5, "events": [{"type": "BlockStored", "block_hashes": ["i:12"],
      "parent_block_hash": null, "token_ids": [...], "block_size": 32, "extra_keys": null,
      "lora": false, "medium": "GPU"}, {"type": "BlockRemoved", "block_hashes": ["i:12"],
      "medium": "GPU"}, {"type": "AllBlocksCleared"}]}
    {"notice": "gap", "from": 3, "to": 9}          # batches the replay could not give back
    {"notice": "restart", "seq": 0, "last": 812}   # the publisher's sequence began again

Both encodings vLLM has used are read: events as tagged maps (``{"type": "BlockStored", ...}``,
0.32 / 0.33) and as tagged positional arrays (``["BlockStored", hashes, parent, ...]``, older
releases); block hashes as 64-bit ints (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``, the default)
or raw bytes, written ``"i:<int>"`` / ``"b:<hex>"``. On start the relay asks the replay socket
for everything still buffered, and again from the last seen batch whenever the live stream
skips one (a reconnect). It exits when its stdin closes (the gateway is gone).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["normalize_batch", "normalize_event"]

_END_SEQ = -1
_REPLAY_WAIT_S = 5.0
_FIELDS = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
    ),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}
"""Each event's leading fields in declaration order (the positional encoding)."""


def _hash(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"not a block hash: {value!r}")
    if isinstance(value, int):
        return f"i:{value}"
    if isinstance(value, bytes | bytearray):
        return f"b:{bytes(value).hex()}"
    raise ValueError(f"not a block hash: {value!r}")


def _plain(value: Any) -> Any:
    """JSON-safe: bytes as hex, tuples as lists."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def normalize_event(raw: Any) -> dict[str, Any]:
    """One decoded event (a tagged map or a tagged array) as the relay writes it."""
    if isinstance(raw, dict):
        kind = raw.get("type")
        fields = dict(raw)
    elif isinstance(raw, list | tuple) and raw and isinstance(raw[0], str):
        kind = raw[0]
        names = _FIELDS.get(kind, ())
        fields = dict(zip(names, raw[1:], strict=False))
    else:
        raise ValueError(f"unreadable KV event: {raw!r}")
    if kind not in _FIELDS:
        raise ValueError(f"unknown KV event type {kind!r}")
    out: dict[str, Any] = {"type": kind}
    if kind == "AllBlocksCleared":
        return out
    out["block_hashes"] = [_hash(h) for h in fields.get("block_hashes") or ()]
    out["medium"] = fields.get("medium")
    if kind == "BlockStored":
        out["parent_block_hash"] = _hash(fields.get("parent_block_hash"))
        out["token_ids"] = [int(t) for t in fields.get("token_ids") or ()]
        out["block_size"] = int(fields.get("block_size") or 0)
        out["extra_keys"] = _plain(fields.get("extra_keys"))
        out["lora"] = bool(fields.get("lora_name") or fields.get("lora_id"))
    return out


def normalize_batch(seq: int, raw: Any) -> dict[str, Any]:
    """One decoded batch (``[ts, events, dp_rank]``, or a map) as the relay writes it."""
    if isinstance(raw, dict):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    elif isinstance(raw, list | tuple) and len(raw) >= 2:
        ts, events, rank = raw[0], raw[1], raw[2] if len(raw) > 2 else None
    else:
        raise ValueError(f"unreadable KV event batch: {raw!r}")
    return {
        "seq": seq,
        "ts": ts,
        "dp_rank": rank,
        "events": [normalize_event(e) for e in events or ()],
    }


class _Relay:
    def __init__(self, endpoint: str, replay: str | None, topic: str) -> None:
        import msgspec
        import zmq

        self._zmq = zmq
        self._decode = msgspec.msgpack.decode
        self._ctx = zmq.Context.instance()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._sub.connect(endpoint)
        self._replay = None
        if replay:
            self._replay = self._ctx.socket(zmq.DEALER)
            self._replay.connect(replay)
        self.last: int | None = None
        self._replaying_since: float | None = None
        self._pending: list[tuple[int, bytes]] = []

    def _write(self, obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
        sys.stdout.flush()

    def _ask_replay(self, start: int) -> None:
        if self._replay is not None and self._replaying_since is None:
            self._replaying_since = time.monotonic()
            self._replay.send_multipart((b"", start.to_bytes(8, "big")))

    def _replayed(self) -> None:
        """The replay ended (or gave up): the live batches that came meanwhile, in order."""
        self._replaying_since = None
        pending, self._pending = sorted(self._pending), []
        for seq, payload in pending:
            self._batch(seq, payload, live=False)
        self._write({"notice": "replayed", "last": self.last})

    def _batch(self, seq: int, payload: bytes, *, live: bool) -> None:
        if live and self._replaying_since is not None:
            self._pending.append((seq, payload))
            return
        last = self.last
        if last is not None and seq <= last:
            if not (live and seq == 0 and last > 0):
                return  # already relayed (a replay and the live stream overlap)
            self._write({"notice": "restart", "seq": seq, "last": last})
        elif seq > (-1 if last is None else last) + 1:
            if live and self._replay is not None:
                self._pending.append((seq, payload))  # after the hole is filled
                self._ask_replay(0 if last is None else last + 1)
                return
            self._write({"notice": "gap", "from": 0 if last is None else last + 1, "to": seq})
        try:
            record = normalize_batch(seq, self._decode(payload))
        except (ValueError, TypeError) as exc:
            record = {"seq": seq, "error": f"{type(exc).__name__}: {exc}"}
        self.last = seq
        self._write(record)

    def run(self) -> None:
        zmq = self._zmq
        poller = zmq.Poller()
        poller.register(self._sub, zmq.POLLIN)
        if self._replay is not None:
            poller.register(self._replay, zmq.POLLIN)
        poller.register(sys.stdin.fileno(), zmq.POLLIN)
        self._ask_replay(0)
        while True:
            for sock, _ in poller.poll(1000):
                if sock == sys.stdin.fileno():
                    if not os.read(sys.stdin.fileno(), 4096):
                        return  # the gateway is gone
                elif sock is self._sub:
                    frames = self._sub.recv_multipart()
                    if len(frames) == 3:
                        self._batch(int.from_bytes(frames[1], "big"), frames[2], live=True)
                elif sock is self._replay:
                    frames = self._replay.recv_multipart()
                    if len(frames) != 4:
                        continue
                    seq = int.from_bytes(frames[2], "big", signed=True)
                    if seq == _END_SEQ:
                        self._replayed()
                    else:
                        self._batch(seq, frames[3], live=False)
            since = self._replaying_since
            if since is not None and time.monotonic() - since > _REPLAY_WAIT_S:
                self._replayed()  # no answer: go on live, the hole reported


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentclaims_vllm.events")
    parser.add_argument("endpoint", help="vLLM's KV events PUB endpoint (ipc://...)")
    parser.add_argument("--replay", default=None, help="its replay endpoint")
    parser.add_argument("--topic", default="", help="the topic vLLM publishes on")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        _Relay(args.endpoint, args.replay, args.topic).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
