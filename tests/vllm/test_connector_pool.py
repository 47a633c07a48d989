"""The connector's port onto vLLM's own ``BlockPool`` (``connector._VllmPool``), run in the vLLM
environment on a real pool: a released hold goes back to the free queue's tail (evicted
last), a finished agent's to its head (the next victims, its tail first), and the claim book
over it sheds soft holds for running requests (``relieve``: the deepest blocks it needs, to
the free queue's head) and keeps hard ones within their own cap."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest

CHILD = textwrap.dedent(
    """
    import json
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id, BlockHash
    from agentclaims_vllm.claims import ClaimBook
    from agentclaims_vllm.connector import _VllmPool

    pool = BlockPool(17, True, 16)  # block 0 is vLLM's null block: 16 usable

    def request(n, tag):
        blocks = pool.get_new_blocks(n)
        for i, b in enumerate(blocks):
            b.set_block_hash(make_block_hash_with_group_id(BlockHash(f"{tag}{i}".encode()), 0))
        return blocks

    def queue():
        return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]

    port = _VllmPool(pool)
    book = ClaimBook(port, 16, 8, soft_reserve_blocks=1, clock=lambda: 0.0)
    out = {}
    a, b = request(3, "a"), request(3, "b")
    for name, run in (("a", a), ("b", b)):
        book.hold(name, "t", "demotable", run, next_use_s=5)
        pool.free_blocks(reversed(run))  # the request ends; the hold keeps its blocks
    out["held_free"] = pool.get_num_free_blocks()
    rest = queue()
    book.release("a", "t")  # its agent goes on: to the tail, evicted last
    out["tail"] = queue()[len(rest):]
    book.release("b", "t", evict_first=True)  # its agent is done: the next victims
    out["head"] = queue()[:3]
    out["a"] = [x.block_id for x in a]
    out["b"] = [x.block_id for x in b]
    # soft holds may take past the hard holds' cap (8 of 16 here), and make room for the
    # running requests' next blocks before a step
    c = request(12, "c")
    out["soft"] = book.hold("c", "t", "demotable", c, next_use_s=5)["decision"]
    pool.free_blocks(reversed(c))
    out["hard_over_cap"] = book.hold("h", "t", "hard_protected", c[:9], ttl_s=9)["decision"]
    out["free_before"] = pool.get_num_free_blocks()
    out["shed"] = book.relieve(6)
    out["free_after"] = pool.get_num_free_blocks()
    out["victims"] = queue()[:2]  # the blocks pressure took: the next victims
    out["c"] = [x.block_id for x in c]
    out["kept"] = len(book.holds["c"].blocks)  # its head, kept though its claim is demoted
    out["claimed"] = book.claimed_blocks
    out["events"] = [e["event"] for e in book.events_since(0)]
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def child() -> dict[str, object]:
    from agentclaims.vllm import vllm_python

    done = subprocess.run(
        [vllm_python(), "-c", CHILD], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_release_goes_to_the_tail_and_a_finished_agents_to_the_head(
    child: dict[str, object],
) -> None:
    assert child["held_free"] == 10  # 16 less the 6 held
    a, b = child["a"], child["b"]
    assert isinstance(a, list)
    assert isinstance(b, list)
    assert child["tail"] == list(reversed(a))  # tail first: the last block is evicted first
    assert child["head"] == list(reversed(b))  # and at the head: the very next victims


def test_soft_holds_fill_past_the_hard_cap_and_make_room_for_running_requests(
    child: dict[str, object],
) -> None:
    assert child["soft"] == "accepted"  # 12 of 16 blocks: past the hard cap of 8
    assert child["hard_over_cap"] == "rejected"  # 9 hard blocks: over their own cap
    assert child["free_before"] == 4
    assert child["shed"] == 1
    assert child["free_after"] == 6  # no more than it needed: its two deepest blocks
    c = child["c"]
    assert isinstance(c, list)
    assert child["victims"] == [c[-1], c[-2]]
    assert child["kept"] == 10
    assert child["claimed"] == 0
    events = child["events"]
    assert isinstance(events, list)
    assert events[-1] == "resident_claim_demoted"
