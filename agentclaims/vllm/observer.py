"""``KVEventsObserver``: vLLM's own block pool events, joined to the gateway's block hashes.

vLLM publishes ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` on ZMQ
(``--kv-events-config``). The gateway's core has no ZMQ: the observer runs the relay of the
connector's distribution (``python -m agentclaims_vllm.events``) in the vLLM environment and
reads its JSON lines (both of vLLM's encodings, replay on reconnect: see that module).

vLLM's block hashes are seeded per process, so they never name a claim. The observer joins each
stored block to the gateway's own chained hash of the same tokens (``hash_block_tokens`` over the
parent's joined hash, the block's token ids and its cache salt): the hash a claim's prefix id is
made of. A block whose parent was never seen, or whose extra keys the gateway does not hash
(LoRA, multimodal), stays unjoined: never reported resident (fail closed). A hole in the stream
that replay could not fill, or a publisher that began its sequence again (a vLLM restart),
forgets everything known: residency is then only what is stored afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from agentclaims.contract import BlockHash
from agentclaims.engine.blocks import hash_block_tokens

__all__ = ["KVEventsObserver", "replay_endpoint"]

log = logging.getLogger("agentclaims.vllm.observer")

Listener = Callable[[set[BlockHash], str], None]
"""Called with the gateway hashes that stopped being resident and why."""


def replay_endpoint(endpoint: str) -> str:
    """The replay endpoint that goes with a KV events endpoint (``agentclaims vllm serve``'s
    convention: the same ``ipc://`` path with ``-replay``)."""
    return f"{endpoint}-replay"


def _silent(endpoint: str, replay: str, waited_s: float) -> dict[str, Any]:
    """The notice for a replay socket that did not answer at the start: most likely no vLLM
    publishes on ``endpoint`` (a wrong ``--kv-events``)."""
    path = endpoint.removeprefix("ipc://")
    missing = "" if os.path.exists(path) else f" (there is no socket at {path})"
    return {
        "notice": "silent",
        "endpoint": endpoint,
        "detail": f"vLLM's KV events replay at {replay} did not answer within {waited_s:g} s"
        f"{missing}: is --kv-events where this vLLM publishes them (`agentclaims vllm serve` "
        "prints it)? Until its events come, no claim is seen materialized",
    }


class KVEventsObserver:
    """Which of the gateway's block hashes vLLM holds in its prefix cache, from its events."""

    def __init__(
        self,
        endpoint: str,
        *,
        python: str,
        block_size: int,
        replay: str | None = None,
        topic: str = "",
    ) -> None:
        self.endpoint = endpoint
        self.replay = replay
        self.topic = topic
        self.block_size = block_size
        self._python = python
        self._joined: dict[str, BlockHash | None] = {}
        """vLLM hash -> the gateway's hash of the same block (None: could not be joined)."""
        self._copies: dict[str, int] = {}
        """vLLM hash -> cached copies (the same content may be cached in more than one block)."""
        self._resident: dict[BlockHash, str] = {}
        """gateway hash -> vLLM hash, while at least one copy is cached."""
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._changed = asyncio.Condition()
        self._replayed = asyncio.Event()
        self.on_removed: Listener | None = None
        self.on_stored: Callable[[set[BlockHash]], None] | None = None
        self.batches = 0
        self.last_seq: int | None = None
        self.unjoined = 0
        """Stored blocks the observer could not join to a gateway hash."""
        self.notices: list[dict[str, Any]] = []
        """Gaps, restarts and unreadable batches, in order (the last 100)."""
        self.last_event_at = 0.0
        self.clears = 0
        """``AllBlocksCleared`` events seen."""

    # ------------------------------------------------------------------ the relay
    async def start(self, *, replay_wait_s: float = 5.0) -> None:
        """Start the relay, and wait (bounded) until it has replayed what vLLM still buffers."""
        if self._proc is not None:
            return
        argv = [self._python, "-m", "agentclaims_vllm.events", self.endpoint]
        if self.replay:
            argv += ["--replay", self.replay]
        if self.topic:
            argv += ["--topic", self.topic]
        self._proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=64 * 1024 * 1024,
        )
        self._reader = asyncio.ensure_future(self._read())
        if self.replay:
            try:
                await asyncio.wait_for(self._replayed.wait(), replay_wait_s)
            except TimeoutError:  # said, never silent: residency and materialization wait on it
                self._note(_silent(self.endpoint, self.replay, replay_wait_s))

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def _read(self) -> None:
        proc = self._proc
        assert proc is not None
        assert proc.stdout is not None
        while True:
            line = await proc.stdout.readline()
            if not line:
                if self._proc is not None:  # not closed by us
                    log.error("KV events relay ended (exit %s)", proc.returncode)
                    self._forget("the KV events relay ended", lost=False)
                return
            try:
                record = json.loads(line)
            except ValueError:
                continue
            await self.apply(record)

    async def aclose(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            if proc.stdin is not None:
                proc.stdin.close()  # the relay exits when its stdin closes
            try:
                await asyncio.wait_for(proc.wait(), 2.0)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    # ------------------------------------------------------------------ the join
    async def apply(self, record: dict[str, Any]) -> None:
        """One relayed line: a batch of events, or a notice."""
        notice = record.get("notice")
        if notice == "replayed":
            self._replayed.set()
        elif notice == "restart":
            self._note(record)
            self._forget(f"vLLM's KV event sequence began again (a restart): {record}")
        elif notice == "gap":
            self._note(record)
            self._forget(f"KV events lost: {record}", lost=False)
        elif "error" in record:
            self._note(record)
            self._forget(f"unreadable KV event batch: {record['error']}", lost=False)
        else:
            self.batches += 1
            self.last_seq = record.get("seq")
            self.last_event_at = time.monotonic()
            for event in record.get("events") or ():
                self._event(event)
        async with self._changed:
            self._changed.notify_all()

    def _note(self, record: dict[str, Any]) -> None:
        self.notices = [*self.notices[-99:], record]
        log.warning("KV events: %s", record)

    def _event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "BlockStored":
            self._stored(event)
        elif kind == "BlockRemoved":
            lost = set()
            for vh in event.get("block_hashes") or ():
                n = self._copies.get(vh, 0) - 1
                if n > 0:
                    self._copies[vh] = n
                    continue
                self._copies.pop(vh, None)
                ours = self._joined.pop(vh, None)
                if ours is not None and self._resident.get(ours) == vh:
                    del self._resident[ours]
                    lost.add(ours)
            if lost and self.on_removed is not None:
                self.on_removed(lost, "evicted from vLLM's prefix cache (BlockRemoved)")
        elif kind == "AllBlocksCleared":
            self.clears += 1
            self._forget("vLLM cleared its prefix cache (AllBlocksCleared)")

    def _stored(self, event: dict[str, Any]) -> None:
        hashes = event.get("block_hashes") or []
        tokens = event.get("token_ids") or []
        size = int(event.get("block_size") or 0)
        extra = event.get("extra_keys") or [None] * len(hashes)
        parent_vh = event.get("parent_block_hash")
        parent: BlockHash | None = None
        joinable = size == self.block_size and not event.get("lora")
        if parent_vh is not None:
            parent = self._joined.get(parent_vh)
            joinable = joinable and parent is not None
        stored = set()
        for i, vh in enumerate(hashes):
            ours: BlockHash | None = None
            keys = _our_extra(extra[i] if i < len(extra) else None)
            chunk = tokens[i * size : (i + 1) * size]
            if joinable and keys is not None and len(chunk) == size:
                ours = hash_block_tokens(parent, chunk, keys)
            else:
                joinable = False  # every later block of this chain is unjoinable too
                self.unjoined += 1
            self._joined[vh] = ours
            self._copies[vh] = self._copies.get(vh, 0) + 1
            if ours is not None:
                self._resident[ours] = vh
                stored.add(ours)
            parent = ours
        if stored and self.on_stored is not None:
            self.on_stored(stored)

    def _forget(self, why: str, *, lost: bool = True) -> None:
        """Drop everything known. ``lost``: vLLM dropped the blocks (a clear, a restart);
        otherwise only the knowledge went (a hole in the stream): nothing is reported lost,
        and residency is unknown (not resident) until blocks are stored again."""
        gone = set(self._resident)
        self._joined.clear()
        self._copies.clear()
        self._resident.clear()
        if lost and gone and self.on_removed is not None:
            self.on_removed(gone, why)

    # ------------------------------------------------------------------ queries
    def resident(self, block_hashes: Iterable[BlockHash]) -> list[bool]:
        return [h in self._resident for h in block_hashes]

    def leading_run(self, block_hashes: Sequence[BlockHash]) -> int:
        n = 0
        for h in block_hashes:
            if h not in self._resident:
                break
            n += 1
        return n

    @property
    def resident_blocks(self) -> int:
        return len(self._resident)

    async def wait_resident(self, block_hashes: Sequence[BlockHash], timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until every one of ``block_hashes`` is seen stored: the
        barrier that orders the events of a request vLLM has answered before what follows."""
        wanted = list(block_hashes)

        def ready() -> bool:
            return all(h in self._resident for h in wanted)

        if ready():
            return True
        try:
            async with self._changed:
                await asyncio.wait_for(self._changed.wait_for(ready), timeout_s)
        except TimeoutError:
            return False
        return True

    async def cleared(self, since: int, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) for an ``AllBlocksCleared`` after the ``since``-th."""
        try:
            async with self._changed:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self.clears > since), timeout_s
                )
        except TimeoutError:
            return False
        return True

    async def quiet(self, quiet_s: float = 0.05, timeout_s: float = 1.0) -> None:
        """Wait until no batch came for ``quiet_s`` (at most ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            idle = time.monotonic() - self.last_event_at
            if idle >= quiet_s:
                return
            await asyncio.sleep(quiet_s - idle)

    def stats(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "running": self.running,
            "batches": self.batches,
            "last_seq": self.last_seq,
            "resident_blocks": self.resident_blocks,
            "unjoined_blocks": self.unjoined,
            "notices": self.notices[-5:],
        }


def _our_extra(keys: Any) -> tuple[object, ...] | None:
    """The gateway's extra hash keys for a block's published ones: its cache salt, or none;
    ``None`` when the block has keys the gateway does not hash (it cannot be joined)."""
    if keys is None or keys == []:
        return ()
    if isinstance(keys, list) and len(keys) == 1 and isinstance(keys[0], str):
        return ("cache_salt", keys[0])
    return None
