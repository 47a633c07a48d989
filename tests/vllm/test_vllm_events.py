"""vLLM's KV events as the gateway reads them: vLLM's own ZmqEventPublisher (in the vLLM
environment, no server needed) publishing both encodings vLLM has used, the relay
(`python -m agentclaims_vllm.events`) with replay on connect, and the observer joining the
blocks to the gateway's hashes; and the harm a held claim's lost block would be."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import _vllm_python

from agentclaims.contract import CacheIdentity, ClaimSpec, ClaimState, ProtectionMode
from agentclaims.engine import hash_token_blocks
from agentclaims.vllm.kv import VllmKV
from agentclaims.vllm.mirror import MirroredClaim
from agentclaims.vllm.observer import KVEventsObserver, replay_endpoint

BS = 4
TOKENS = list(range(100, 116))  # 4 full blocks of 4

PUBLISHER = r"""
import sys, time
import msgspec
from vllm.distributed.kv_events import (
    AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, ZmqEventPublisher,
)

class OldStored(msgspec.Struct, array_like=True, tag="BlockStored"):
    block_hashes: list
    parent_block_hash: object
    token_ids: list
    block_size: int
    lora_id: object
    medium: object

class OldCleared(msgspec.Struct, array_like=True, tag="AllBlocksCleared"):
    pass

class OldBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list
    data_parallel_rank: object = None

tokens = list(range(100, 116))
salt = "tenant-a"
rounds = [
    # map-tagged (vLLM 0.32 / 0.33), int hashes: blocks 0 and 1, the salt on block 0;
    # positional arrays (older releases), bytes hashes: blocks 2 and 3 after block 1
    [KVEventBatch(ts=time.time(), events=[BlockStored(
        block_hashes=[11, 12], parent_block_hash=None, token_ids=tokens[:8], block_size=4,
        lora_id=None, medium="GPU", lora_name=None, extra_keys=[(salt,), None])]),
     OldBatch(ts=time.time(), events=[OldStored(
        block_hashes=[b"\x0d", b"\x0e"], parent_block_hash=12, token_ids=tokens[8:16],
        block_size=4, lora_id=None, medium="GPU")])],
    [KVEventBatch(ts=time.time(), events=[BlockRemoved(block_hashes=[b"\x0e"], medium="GPU")])],
    [OldBatch(ts=time.time(), events=[OldCleared()])],
]
pubs = [ZmqEventPublisher(0, endpoint=e, replay_endpoint=e + "-replay") for e in sys.argv[1:]]
done = [0] * len(pubs)
for k, pub in enumerate(pubs):  # the first round goes out before anyone listens
    for batch in rounds[0]:
        pub.publish(batch)
    done[k] = 1
print("published", flush=True)
for line in sys.stdin:  # "K": the next round on publisher K
    k = int(line)
    for batch in rounds[done[k]]:
        pubs[k].publish(batch)
    done[k] += 1
for pub in pubs:
    pub.shutdown()
"""


@pytest.fixture(scope="module")
def publishers(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """vLLM's ZmqEventPublisher, one per test on an ipc:// endpoint of its own (one process:
    importing vLLM takes seconds), each driven a round at a time."""
    where = tmp_path_factory.mktemp("events")
    endpoints = [f"ipc://{where}/events-{k}.kv" for k in range(2)]
    proc = subprocess.Popen(
        [_vllm_python(), "-c", PUBLISHER, *endpoints],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "published"
        yield proc, endpoints
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def step(proc: subprocess.Popen[str], k: int) -> None:
    """The next round of events on publisher ``k``."""
    assert proc.stdin is not None
    proc.stdin.write(f"{k}\n")
    proc.stdin.flush()


async def until(check: Any, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "not within the time"
        await asyncio.sleep(0.02)


async def test_both_encodings_replayed_then_live_joined_to_the_gateways_hashes(
    publishers: tuple[subprocess.Popen[str], list[str]],
) -> None:
    """The observer connects after two batches went out (one per encoding, int and bytes
    hashes): replay gives them back; each block is joined to the gateway's chained hash of its
    tokens (the cache salt on block 0); a live BlockRemoved and AllBlocksCleared follow."""
    proc, endpoints = publishers
    endpoint = endpoints[0]
    observer = KVEventsObserver(
        endpoint, python=_vllm_python(), block_size=BS, replay=replay_endpoint(endpoint)
    )
    removed: list[tuple[set[Any], str]] = []
    observer.on_removed = lambda lost, why: removed.append((lost, why))
    ours = hash_token_blocks(TOKENS, BS, cache_salt="tenant-a")
    try:
        await observer.start()
        await until(lambda: observer.batches == 2)
        assert observer.resident(ours) == [True] * 4
        assert observer.resident(hash_token_blocks(TOKENS, BS)) == [False] * 4  # unsalted
        assert observer.unjoined == 0
        step(proc, 0)
        await until(lambda: observer.batches == 3)
        assert observer.resident(ours) == [True, True, True, False]
        assert removed == [({ours[3]}, "evicted from vLLM's prefix cache (BlockRemoved)")]
        step(proc, 0)
        await until(lambda: observer.clears == 1)
        assert observer.resident(ours) == [False] * 4
        assert removed[-1][0] == set(ours[:3])
    finally:
        await observer.aclose()
    assert not observer.running


async def test_a_held_claims_block_removed_is_harm_and_the_side_fails_closed(
    publishers: tuple[subprocess.Popen[str], list[str]],
) -> None:
    """A claim the gateway believes held, whose block vLLM's events show removed while the
    connector cannot say it ended, is harmed with the cause (predicate before true, after
    false), and no claim is accepted after it: a connector bug must not pass silently."""
    proc, endpoints = publishers
    endpoint = endpoints[1]
    kv = VllmKV(
        "http://127.0.0.1:9",  # nothing listens: the connector cannot be asked
        "key",
        block_size=BS,
        kv_events=endpoint,
        kv_events_replay=replay_endpoint(endpoint),
        events_python=_vllm_python(),
    )
    assert kv.observer is not None
    kv.observer.on_stored = kv.mirror.blocks_stored
    ours = hash_token_blocks(TOKENS, BS, cache_salt="tenant-a")
    identity = CacheIdentity("vllm:test", "m", "t", "default", BS)
    spec = ClaimSpec("held-1", "wf", "p-1", identity, 4, ProtectionMode.HARD_PROTECTED)
    kv.mirror.put(MirroredClaim(spec, ClaimState.ACCEPTED, 4, hashes=tuple(ours)))
    try:
        await kv.observer.start()
        await until(lambda: kv.mirror.claims["held-1"].state is ClaimState.MATERIALIZED)
        step(proc, 1)
        await until(lambda: kv.mirror.claims["held-1"].state is ClaimState.HARMED)
        await asyncio.gather(*list(kv.mirror.judging))
    finally:
        await kv.aclose()
    events = kv.mirror.events.events_since(0)
    names = [e.event.value for e in events]
    assert names == ["resident_claim_materialized", "resident_claim_harmed"]
    harm = events[-1]
    assert harm.data["predicate_before"] is True
    assert harm.data["predicate_after"] is False
    assert harm.data["positions"] == [3]
    assert "while the connector held them" in harm.data["cause"]
    assert kv.mirror.fault is not None
    assert "held-1" in kv.mirror.fault
    other = ClaimSpec("next-1", "wf", "p-2", identity, 1, ProtectionMode.SOFT_PRIORITY)
    assert kv._gated(other) == kv.mirror.fault
