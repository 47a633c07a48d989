"""The scripted model and the stand-in tokenizers."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentclaims.engine import ByteTokenizer, WordTokenizer, tokenizer_named
from agentclaims.errors import UnknownNameError, UsageError
from agentclaims.gateway import Reply, ScriptedModel, TextRequest


def chat(*messages: dict[str, Any], node: str | None = None) -> TextRequest:
    return TextRequest(kind="chat", model="m", messages=messages, node=node)


async def test_default_reply_echoes_a_few_words() -> None:
    """Without a script the model echoes at most twelve words of the last message."""
    reply = await ScriptedModel().complete(chat({"role": "user", "content": "one two three"}))
    assert reply == Reply.text("echo: one two three")
    long = ScriptedModel().reply(chat({"role": "user", "content": " ".join(["w"] * 50)}))
    assert long.content is not None
    assert len(long.content.split()) == 13


def test_mapping_script_picks_the_turn_per_node() -> None:
    """A node's replies are indexed by the number of assistant turns; the last one repeats."""
    model = ScriptedModel({"agent": [Reply.tool("search", {"q": 1}), "done"], "*": ["other"]})
    first = model.reply(chat({"role": "user", "content": "x"}, node="agent"))
    assert first.finish_reason == "tool_calls"
    assistant = {"role": "assistant", "content": None}
    assert model.reply(chat({"role": "user"}, assistant, node="agent")) == Reply.text("done")
    assert model.reply(chat({"role": "user"}, assistant, assistant, node="agent")) == Reply.text(
        "done"
    )
    assert model.reply(chat({"role": "user"}, node="critic")) == Reply.text("other")


def test_callable_script_and_fallback() -> None:
    """A callable script answers; returning None falls back to the echo."""
    model = ScriptedModel(lambda r: "yes" if r.node == "a" else None)
    assert model.reply(chat({"role": "user", "content": "q"}, node="a")) == Reply.text("yes")
    assert model.reply(chat({"role": "user", "content": "q"})) == Reply.text("echo: q")


@pytest.mark.parametrize("script", [42, {"a": "not a list"}, {"a": []}, {"a": [3]}])
def test_bad_scripts_are_usage_errors(script: Any) -> None:
    """A script that is neither callable nor a mapping of reply lists is refused."""
    with pytest.raises(UsageError):
        ScriptedModel(script)


def test_callable_returning_garbage_is_a_usage_error() -> None:
    """A script callable must return a Reply, a str or None."""
    with pytest.raises(UsageError):
        ScriptedModel(lambda r: 3).reply(chat({"role": "user"}))  # type: ignore[arg-type,return-value]


def test_tool_call_ids_are_stable_per_request() -> None:
    """The same request key gives the same tool call ids (retries see the same ids)."""
    reply = Reply.tool("search", {"q": "a"})
    assert reply.message("k1") == reply.message("k1")
    assert reply.message("k1")["tool_calls"][0]["id"] != reply.message("k2")["tool_calls"][0]["id"]


messages_st = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["system", "user", "assistant", "tool"]),
            "content": st.text(max_size=40),
        }
    ),
    min_size=1,
    max_size=6,
)


@given(messages=messages_st, cut=st.integers(0, 6))
def test_tokenizers_are_prefix_preserving(messages: list[dict[str, Any]], cut: int) -> None:
    """Tokens of the first k messages are a prefix of the tokens of all messages."""
    for tok in (ByteTokenizer(), WordTokenizer()):
        whole = [t for m in messages for t in tok.encode_message(m)]
        head = [t for m in messages[:cut] for t in tok.encode_message(m)]
        assert whole[: len(head)] == head
        assert whole == [t for m in messages for t in tok.encode_message(dict(m))]


def test_tokenizer_lookup_by_id() -> None:
    """Built-in tokenizers are found by id; an unknown id names the field."""
    assert isinstance(tokenizer_named("agentclaims-words"), WordTokenizer)
    with pytest.raises(UnknownNameError):
        tokenizer_named("gpt2")


def test_word_tokenizer_counts_words_and_marks() -> None:
    """One token per word or punctuation mark, ids stable across calls."""
    tok = WordTokenizer()
    assert len(tok.encode("Hello, world!")) == 4
    assert tok.encode("Hello") == tok.encode("Hello")
