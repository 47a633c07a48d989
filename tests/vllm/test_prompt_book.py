"""The prompt book hashes a prompt's new blocks only: what it reuses from the prefixes it
served (``PromptBook.known_chain``) is exactly what hashing the whole prompt gives. It takes
and keeps tokens packed (``pack_tokens``), as the gateway hands them over."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentclaims.engine.blocks import hash_token_blocks, pack_tokens
from agentclaims.errors import UsageError
from agentclaims.vllm.prompts import MAX_TOKENS, RECENT, PromptBook, chain_hashes

SIZE = 4
P = pack_tokens

tokens_st = st.lists(st.integers(0, 5), max_size=40)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(tokens_st, st.sampled_from([None, "a", "b"])), min_size=1, max_size=12),
    st.integers(1, 20),
    st.sampled_from([None, "a", "b"]),
    tokens_st,
)
def test_a_known_chain_is_the_prompts_own(
    served: list, most: int, salt: str | None, tail: list[int]
) -> None:
    """After any prefixes served (under any salts, the oldest forgotten past ``most``), a
    prompt that extends one of them (or none) gets leading hashes equal to its own, and its
    hashes, prompt and sequence, hashed from there are those hashed from scratch."""
    book = PromptBook(SIZE, most)
    for tokens, under in served:
        book.register(P(tokens), under)
    base, _ = served[-1]
    prompt = [*base[: len(base) // 2], *tail]  # shares a beginning with the last served
    known = book.known_chain(P(prompt), salt)
    whole = hash_token_blocks(prompt, SIZE, cache_salt=salt)
    assert known == whole[: len(known)]
    sequence = [*prompt, 1, 2, 3, 4, 5] if len(prompt) >= SIZE else None
    packed = None if sequence is None else P(sequence)
    assert chain_hashes(SIZE, P(prompt), packed, salt, known) == chain_hashes(
        SIZE, P(prompt), packed, salt
    )
    assert chain_hashes(SIZE, P(prompt), packed, salt)[1] == (
        hash_token_blocks(sequence, SIZE, cache_salt=salt) if sequence else []
    )
    assert book.register(P(prompt), salt) == (whole, book.register(P(prompt), salt, whole)[1])


def test_an_agents_next_prompt_reuses_all_its_last_one_served() -> None:
    """A conversation that grows turn by turn: each prompt's blocks up to the last one's
    sequence come from the book; another salt (another tenant) gets none of them."""
    book = PromptBook(SIZE, 100)
    conversation = list(range(10))
    for turn in range(6):
        known = book.known_chain(P(conversation), "t")
        served = hash_token_blocks(conversation, SIZE, cache_salt="t")
        if turn:
            assert len(known) == len(conversation[:-3]) // SIZE  # the last sequence's blocks
        assert known == served[: len(known)]
        assert book.known_chain(P(conversation), "other") == []
        sequence = [*conversation, 7, 7, 7]
        book.register(P(sequence), "t")
        conversation = [*sequence, turn, turn, turn, turn, turn]


def test_the_book_keeps_a_few_prefixes_per_beginning_and_forgets_with_its_prefixes() -> None:
    book = PromptBook(SIZE, 3)
    first = [1, 1, 1, 1]
    pids = [book.register(P([*first, i, i, i, i]), None)[1] for i in range(RECENT + 2)]
    assert book.get(pids[0]) is None  # forgotten past the most
    newest = book.known_chain(P([*first, *[RECENT + 1] * 4, 9]), None)
    assert len(newest) == 2
    oldest = book.known_chain(P([*first, 0, 0, 0, 0]), None)
    assert len(oldest) == 1  # its prefix went: only the shared first block is known


def test_agents_that_share_a_system_prompt_each_reuse_their_own_conversation() -> None:
    """Twenty agents whose prompts begin with the same three blocks, their calls interleaved:
    each call's prompt finds all of what its own agent's last call served, though nineteen
    others served prefixes beginning the same way since."""
    size = 4
    book = PromptBook(size, 1_000)
    system = [9] * (3 * size)
    conversations = {agent: [*system, agent, agent, 100, 101] for agent in range(20)}
    for turn in range(5):
        for agent, conversation in conversations.items():
            known = book.known_chain(P(conversation), None)
            if turn:
                assert len(known) == (len(conversation) - 2 * size) // size  # its last sequence
            assert known == hash_token_blocks(conversation, size)[: len(known)]
            sequence = [*conversation, agent, turn, agent, turn]
            book.register(P(conversation), None)
            book.register(P(sequence), None)
            conversations[agent] = [*sequence, 7, 7, 7, 7, turn, turn, turn, turn]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 3), max_size=48), min_size=1, max_size=30),
    st.integers(1, 8),
    st.integers(1, 60),
)
def test_the_book_keeps_at_most_its_tokens_and_forgets_the_least_recent_first(
    served: list[list[int]], most: int, max_tokens: int
) -> None:
    """After any prompts served, the book keeps at most ``max_prefixes`` prefixes and
    ``max_tokens`` tokens in all (or the newest alone, whatever its length); what it keeps
    is the most recently served, each as it was served, and its count of tokens is theirs."""
    book = PromptBook(SIZE, most, max_tokens)
    order: list[str] = []  # prefix ids, least recently served first
    for tokens in served:
        pid = book.register(P(tokens), None)[1]
        if pid is not None:
            order = [p for p in order if p != pid] + [pid]
        kept = [p for p in order if book.get(p) is not None]
        assert kept == order[len(order) - len(kept) :]  # the newest ones, none skipped
        held = sum(len(book.get(p).token_ids()) for p in kept)  # type: ignore[union-attr]
        assert book.tokens == held
        assert len(book) == len(kept) <= most
        assert held <= max_tokens or len(kept) == 1
        if pid is not None:
            assert book.get(pid) is not None  # the newest is always kept
            assert book.get(pid).token_ids() == tokens[: len(tokens) // SIZE * SIZE]  # type: ignore[union-attr]


def test_a_long_prompt_pushes_out_older_ones_and_a_bad_bound_is_refused() -> None:
    book = PromptBook(SIZE, 100, max_tokens=16)
    first = book.register(P([1] * 8), None)[1]
    second = book.register(P([2] * 8), None)[1]
    assert book.tokens == 16
    third = book.register(P([3] * 12), None)[1]  # 28 tokens: the two older ones go, in order
    assert [book.get(p) is not None for p in (first, second, third)] == [False, False, True]
    assert book.tokens == 12
    assert book.known_chain(P([1] * 8), None) == []  # forgotten from the index too
    for bad in (0, -1, 1.5, True):
        with pytest.raises(UsageError, match="max_tokens"):
            PromptBook(SIZE, 100, max_tokens=bad)  # type: ignore[arg-type]
    assert PromptBook(SIZE, 100).max_tokens == MAX_TOKENS
