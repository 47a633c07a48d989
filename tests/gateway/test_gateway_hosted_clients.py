"""The edges a user of the official clients meets: the real ``openai`` and ``anthropic``
clients against a real ``agentclaims serve`` on loopback (the reference engine, a scripted
model), their errors in each API's own shape and class, changing nothing, their streams
reporting what the whole answers report, and their usage consistent over repeated calls."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from servers import gateway_process

from agentclaims.gateway.responses import to_chat

BLOCK = 4
KEY = "ak-alpha-0123456789abcdef"
OPS = "ak-ops-0123456789abcdef"
SCRIPT = {"*": ["hello there friend"], "agent": [{"tool": "lookup", "arguments": {"q": "kv"}}]}
BREAK = {"type": "ephemeral"}


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    script = tmp_path_factory.mktemp("script") / "script.json"
    script.write_text(json.dumps(SCRIPT))
    with gateway_process(
        "--blocks", "1024", "--block-size", str(BLOCK), "--script", str(script)
    ) as u:
        yield u


@pytest.fixture(scope="module")
def keyed_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    keys = tmp_path_factory.mktemp("keys") / "keys.toml"
    keys.write_text(
        f'[[key]]\nkey = "{KEY}"\ntenant = "alpha"\n\n'
        f'[[key]]\nkey = "{OPS}"\ntenant = "ops"\nadmin = true\n'
    )
    with gateway_process(
        "--blocks", "256", "--block-size", str(BLOCK), "--api-keys", str(keys)
    ) as u:
        yield u


def claude(url: str, **kwargs: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, max_retries=0, timeout=20, **kwargs)


def gpt(url: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=20)


def state(url: str, key: str | None = None) -> tuple[Any, ...]:
    """What a refused call must leave as it was: the engine's counters, its claims, its
    events; and the gateway's error counts (which a refused call moves)."""
    headers = {} if key is None else {"authorization": f"Bearer {key}"}
    stats = httpx2.get(f"{url}/v1/stats", headers=headers, timeout=10).json()
    return stats["engine"], stats.get("claims"), stats["events_seq"], stats["gateway"]["errors"]


def user(text: str, cache: bool = False) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": text}
    if cache:
        block["cache_control"] = BREAK
    return {"role": "user", "content": [block]}


# ---------------------------------------------------------------- errors in each API's shape


def call(client: anthropic.Anthropic, stream: bool) -> anthropic.types.Message:
    """A one-turn call, streamed (to its final message) or not."""
    kwargs: dict[str, Any] = {"model": "served", "max_tokens": 8, "messages": [user("hi")]}
    if not stream:
        return client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as events:
        return events.get_final_message()


@pytest.mark.parametrize(
    "client_kwargs",
    [{"api_key": "ak-nobody-0123456789abcd"}, {"auth_token": "ak-nobody-0123456789abcd"}],
    ids=["x-api-key", "bearer"],
)
@pytest.mark.parametrize("stream", [False, True])
def test_a_wrong_key_on_messages_is_a_401_in_the_messages_shape(
    keyed_url: str, client_kwargs: dict[str, str], stream: bool
) -> None:
    """An Anthropic client with a key the gateway does not know, sent as ``x-api-key`` or as
    ``Authorization: Bearer``, streamed or not: ``anthropic.AuthenticationError`` whose body
    is the Messages API's ``authentication_error``; nothing served."""
    before = state(keyed_url, OPS)
    client = claude(keyed_url, **client_kwargs)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        call(client, stream)
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["type"] == "error"
    assert body["error"]["type"] == "authentication_error"
    assert body["agentclaims"]["error"]["type"] == "unauthorized"
    assert state(keyed_url, OPS)[:3] == before[:3]
    # the right key, either way, is served as its tenant
    good = dict.fromkeys(client_kwargs, KEY)
    reply = claude(keyed_url, **good).messages.create(
        model="served", max_tokens=8, messages=[user("hi")]
    )
    assert reply.type == "message"


def test_a_wrong_key_on_openai_routes_is_openais_401(keyed_url: str) -> None:
    client = gpt(keyed_url, "ak-nobody-0123456789abcd")
    with pytest.raises(openai.AuthenticationError) as chat:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.AuthenticationError) as resp:
        client.responses.create(model="m", input="hi")
    for caught in (chat, resp):
        assert isinstance(caught.value.body, dict)
        assert caught.value.body["type"] == "unauthorized"


def test_a_route_messages_does_not_serve_answers_in_its_shape(url: str) -> None:
    """``messages.count_tokens`` (not served here) is the client's ``NotFoundError`` with the
    Messages API's ``not_found_error``, not another API's body."""
    with pytest.raises(anthropic.NotFoundError) as caught:
        claude(url, api_key="none").messages.count_tokens(model="served", messages=[user("hi")])
    body = caught.value.body
    assert isinstance(body, dict)
    assert (body["type"], body["error"]["type"]) == ("error", "not_found_error")


def test_a_body_too_large_for_messages_is_a_413_request_too_large(url: str) -> None:
    before = state(url)
    with pytest.raises(anthropic.ContentTooLargeError) as caught:
        claude(url, api_key="none").messages.create(
            model="served", max_tokens=8, messages=[user("x" * (9 << 20))]
        )
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["error"]["type"] == "request_too_large"
    assert body["agentclaims"]["error"]["field"] == "body"
    assert state(url)[:3] == before[:3]


BAD_MESSAGES = [
    ({"extra_body": {"top_k": "x"}}, "top_k"),
    ({"extra_body": {"temperature": 1.5}}, "temperature"),
    ({"extra_body": {"top_p": True}}, "top_p"),
    ({"metadata": "user-1"}, "metadata"),
    ({"metadata": {"user_id": 7}}, "metadata.user_id"),
    (
        {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        "tools[0].type",
    ),
    (
        {
            "tools": [{"name": "lookup", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool"},
        },
        "tool_choice.name",
    ),
    (
        {
            "messages": [
                user("q"),
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": "x"}],
                },
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
            ]
        },
        "messages[1].content[0].input",
    ),
    (
        {"messages": [user("q", cache=True)], "cache_control": {"type": "ephemeral", "ttl": "2h"}},
        "cache_control.ttl",
    ),
]


@pytest.mark.parametrize(("extra", "field"), BAD_MESSAGES, ids=[f for _, f in BAD_MESSAGES])
def test_a_bad_messages_call_is_a_400_naming_the_field_counted_and_changing_nothing(
    url: str, extra: dict[str, Any], field: str
) -> None:
    """Each bad value: ``anthropic.BadRequestError``, ``invalid_request_error`` naming the
    field; the engine, its claims and events as they were; the gateway's error count up one,
    as on every other route."""
    before = state(url)
    kwargs: dict[str, Any] = {"model": "served", "max_tokens": 8, "messages": [user("hi")]}
    kwargs.update(extra)
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude(url, api_key="none").messages.create(**kwargs)
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith(f"{field}:")
    assert body["agentclaims"]["error"]["field"] == field
    after = state(url)
    assert after[:3] == before[:3]
    assert after[3].get("usage_error", 0) == before[3].get("usage_error", 0) + 1


BAD_RESPONSES = [
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"extra_body": {"tool_choice": {"type": "function"}}}, "tool_choice.name"),
    ({"background": True}, "background"),
    ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"text": {"format": {"type": "json_schema", "name": "out"}}}, "text.format"),
]


@pytest.mark.parametrize(("extra", "field"), BAD_RESPONSES, ids=[f for _, f in BAD_RESPONSES])
def test_a_bad_responses_call_is_a_400_naming_the_field_and_changing_nothing(
    url: str, extra: dict[str, Any], field: str
) -> None:
    before = state(url)
    tools = [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]
    with pytest.raises(openai.BadRequestError) as caught:
        gpt(url).responses.create(model="m", input="hi", tools=tools, **extra)
    assert caught.value.param == field
    assert state(url)[:3] == before[:3]


BAD_CHATS = [
    ({"extra_body": {"user": 5}}, "user"),
    ({"extra_body": {"metadata": "x"}}, "metadata"),
    ({"extra_body": {"metadata": {"k": 1}}}, "metadata"),
    ({"extra_body": {"seed": "x"}}, "seed"),
    ({"tools": [{"type": "function"}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools[0].function.name"),
    ({"prompt_cache_key": "k", "prompt_cache_retention": "7d"}, "prompt_cache_retention"),
]


@pytest.mark.parametrize(("extra", "field"), BAD_CHATS, ids=[f for _, f in BAD_CHATS])
@pytest.mark.parametrize("stream", [False, True])
def test_a_bad_chat_call_is_openais_400_naming_the_field_and_changing_nothing(
    url: str, extra: dict[str, Any], field: str, stream: bool
) -> None:
    before = state(url)
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as caught:
        gpt(url).chat.completions.create(model="m", messages=messages, stream=stream, **extra)
    assert caught.value.param == field
    assert state(url)[:3] == before[:3]


@pytest.mark.parametrize(
    ("extra", "field"), [({"metadata": "x"}, "metadata"), ({"user": 5}, "user")]
)
def test_a_responses_call_with_a_bad_metadata_or_user_is_a_400(
    url: str, extra: dict[str, Any], field: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        gpt(url).responses.create(model="m", input="hi", extra_body=extra)
    assert caught.value.param == field


def test_a_structured_output_is_asked_of_the_engine_not_dropped() -> None:
    """``text.format`` (the Agents SDK's ``output_type``) becomes the chat's
    ``response_format``, as a chat completion asks it of vLLM; ``parallel_tool_calls`` too."""
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    chat = to_chat(
        {
            "model": "m",
            "input": "hi",
            "text": {
                "format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}
            },
            "tools": [{"type": "function", "name": "f", "parameters": {}}],
            "parallel_tool_calls": False,
        }
    )
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": schema, "strict": True},
    }
    assert chat["parallel_tool_calls"] is False
    assert "response_format" not in to_chat(
        {"model": "m", "input": "hi", "text": {"format": {"type": "text"}}}
    )


# ---------------------------------------------------------------- streams as whole answers


def test_a_streamed_stop_sequence_is_reported_as_the_whole_answer_reports_it(url: str) -> None:
    """The reply ends at a stop sequence: streamed or not, the Anthropic client reads
    ``stop_sequence`` and the string; the OpenAI client's finishing chunk carries the
    ``stop_reason`` its whole answer carries."""
    client = claude(url, api_key="none")
    kwargs: dict[str, Any] = {
        "model": "served",
        "max_tokens": 30,
        "messages": [user("say it")],
        "stop_sequences": ["friend"],
    }
    whole = client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as events:
        streamed = events.get_final_message()
    for reply in (whole, streamed):
        assert (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", "friend")
        assert reply.content[0].text == "hello there "
    oa = gpt(url)
    messages = [{"role": "user", "content": "say it"}]
    answer = oa.chat.completions.create(model="m", messages=messages, stop=["friend"])
    chunks = list(
        oa.chat.completions.create(model="m", messages=messages, stop=["friend"], stream=True)
    )
    finishing = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.finish_reason for c in finishing] == ["stop"]
    assert answer.choices[0].model_extra["stop_reason"] == "friend"
    assert finishing[0].model_extra["stop_reason"] == "friend"


def test_a_streamed_response_carries_the_prompt_cache_header(url: str) -> None:
    """``x-agentclaims-prompt-cache`` on a streamed ``/v1/responses`` as on a whole one (and
    as on a streamed chat completion): the decision is made before the first byte."""
    client = gpt(url)
    for stream in (False, True):
        with client.responses.with_streaming_response.create(
            model="m",
            input=f"cache me please {stream}",
            prompt_cache_key=f"hdr-{stream}",
            stream=stream,
        ) as raw:
            assert raw.headers.get("x-agentclaims-prompt-cache") == "accepted"
            raw.read()


# ---------------------------------------------------------------- usage over repeated calls


def test_a_resent_prompt_reports_no_cache_creation(url: str) -> None:
    """A prompt of 2 full blocks and 1 token more, sent three times with its breakpoint:
    the first call writes the 2 blocks its claim holds (the last token is input: no claim
    holds a partial block), the next ones read them and write nothing."""
    client = claude(url, api_key="none")
    messages = [user("one two three four five six seven", cache=True)]
    seen = []
    for _ in range(3):
        reply = client.messages.create(model="served", max_tokens=8, messages=messages)
        u = reply.usage
        seen.append((u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens))
    total = sum(seen[0])
    assert total % BLOCK != 0  # the case at hand: a partial last block
    held = total - total % BLOCK
    assert seen == [(total - held, 0, held), (total - held, held, 0), (total - held, held, 0)]


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    words=st.integers(1, 14),
    steps=st.lists(st.sampled_from(["again", "next", "stream"]), min_size=1, max_size=5),
    tag=st.integers(0, 10**9),
)
def test_usage_adds_up_and_a_conversation_holds_one_claim(
    url: str, words: int, steps: list[str], tag: int
) -> None:
    """Any conversation with a breakpoint on its last block, resent, continued or streamed:
    input + read + creation is the prompt; what is read or written is whole blocks; a resent
    prompt writes nothing; and the conversation holds one live claim, its latest."""
    client = claude(url, api_key="none")
    turns = [f"conversation {tag} " + "word " * words]
    claims: list[str] = []
    last_prompt = None
    for step in steps:
        if step == "next":
            turns.append(f"more {len(turns)}")
        messages: list[dict[str, Any]] = []
        for i, text in enumerate(turns):  # the breakpoint on the last block only
            if i:
                messages.append({"role": "assistant", "content": "ok"})
            messages.append(user(text, cache=i == len(turns) - 1))
        kwargs: dict[str, Any] = {"model": "served", "max_tokens": 8, "messages": messages}
        if step == "stream":
            with client.messages.stream(**kwargs) as events:
                for event in events:
                    if event.type == "message_delta":
                        extension = event.model_extra["agentclaims"]
                reply = events.get_final_message()
        else:
            reply = client.messages.create(**kwargs)
            extension = reply.model_extra["agentclaims"]
        u = reply.usage
        assert u.cache_read_input_tokens % BLOCK == 0
        assert u.cache_creation_input_tokens % BLOCK == 0
        assert u.input_tokens < BLOCK or u.cache_creation_input_tokens == 0
        prompt = u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
        if prompt == last_prompt:
            assert u.cache_creation_input_tokens == 0, u
        last_prompt = prompt
        [report] = extension["cache_control"]
        if report["decision"] == "accepted":
            claims.append(report["claim_id"])
    states = [
        httpx2.get(
            f"{url}/v1/claims/{c}", params={"owner_scope": "anthropic-cache"}, timeout=10
        ).json()["state"]
        for c in claims
    ]
    assert [s == "materialized" for s in states] == [False] * (len(claims) - 1) + [True] * bool(
        claims
    )


# ---------------------------------------------------------------- refusals the clients retry


def test_a_request_larger_than_the_pool_is_not_retried_by_the_clients() -> None:
    """A prompt no pool of this size can hold: the clients, retrying a 409 twice by default,
    are told not to (``x-should-retry: false``): each call is refused once, in its API's shape
    and class, and costs the engine one refusal, not three."""
    prompt = "word " * 80
    with gateway_process("--blocks", "8", "--block-size", str(BLOCK)) as small:
        with pytest.raises(openai.ConflictError) as oa:
            openai.OpenAI(
                base_url=f"{small}/v1", api_key="none", timeout=20
            ).chat.completions.create(model="m", messages=[{"role": "user", "content": prompt}])
        assert oa.value.response.headers["x-should-retry"] == "false"
        assert state(small)[0]["requests_refused"] == 1
        with pytest.raises(anthropic.ConflictError) as an:
            anthropic.Anthropic(base_url=small, api_key="none", timeout=20).messages.create(
                model="m", max_tokens=8, messages=[user(prompt)]
            )
        body = an.value.body
        assert isinstance(body, dict)
        assert body["agentclaims"]["error"]["feasibility"] == "infeasible_exceeds_capacity"
        assert state(small)[0]["requests_refused"] == 2
