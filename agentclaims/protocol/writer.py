"""Who writes a completion's reply: ``ReplyWriter``, the one thing the gateway's completion
pipeline asks besides the claims protocol.

On a real engine the KV side writes it (``VllmKV``: vLLM answers, its connector holds the
claims). Over the reference engine or ``FakeKV`` a text side writes it and the KV side serves
the request's blocks (``agentclaims.gateway.ScriptedWriter``). Either way the gateway parses
the ``agentclaims`` object, lets go of the claims it releases, hands the call to the writer and
answers with the writer's payload, its KV life and the claims' decisions.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from agentclaims.errors import UsageError
from agentclaims.protocol.types import ServeResult

__all__ = [
    "ID_PREFIX",
    "CompletionCall",
    "PlainReply",
    "PlainWrite",
    "QueueFigures",
    "QueueTimes",
    "ReplyStream",
    "ReplyWriter",
    "Written",
    "check_body",
]

CompletionKind = Literal["chat", "completion"]

ID_PREFIX: dict[str, str] = {"chat": "chatcmpl", "completion": "cmpl"}
"""What a completion's id starts with, by its kind (OpenAI's ``chatcmpl-``/``cmpl-``, as vLLM
names its requests too)."""


@dataclass(frozen=True, slots=True)
class CompletionCall:
    """One completion as the gateway hands it to the writer, its claims already checked
    against the caller's tenant."""

    kind: CompletionKind
    body: Mapping[str, Any]
    """The client's body (OpenAI's fields and the ``agentclaims`` object)."""
    claims: tuple[Mapping[str, Any], ...] = ()
    owner_scope: str | None = None
    cache_salt: str | None = None
    request_id: str | None = None
    """The gateway's name for it (the caller's, in its tenant); ``None``: the writer's own."""
    admit: bool = True
    node: str | None = None
    segments: tuple[tuple[int, ...], ...] | None = None
    """The prompt's token ids, one segment per message, when ``prepare`` tokenized it."""
    priority: int | None = None
    """Its place in the engine's queue, where the engine orders by it (lower goes first;
    ``None``: the engine's default): the gateway's, never the caller's
    (``agentclaims.gateway.queueing``)."""


@dataclass(frozen=True, slots=True)
class Written:
    """What the writer answered: the OpenAI payload (without the ``agentclaims`` object) and
    the request's KV life (its outcome, prefix ids and the claims' decisions)."""

    payload: dict[str, Any]
    result: ServeResult


@dataclass(slots=True)
class PlainReply:
    """A plain call's answer from a writer's lean way (``PlainWrite``): the client's payload
    and what its ``agentclaims`` object says, a served outcome with no claims."""

    payload: dict[str, Any]
    request_id: str
    hit_blocks: int
    computed_blocks: int
    prompt: str | None
    sequence: str | None
    events_seq: int
    pool: dict[str, Any] | None = None
    """The engine's pool figures as its last answer that carried them gave them (a call of
    the SDK's with nothing to carry is answered with them: ``fresh_pool_s``)."""


PlainWrite = Callable[..., Awaitable["PlainReply | Written | None"]]
"""A writer's lean way (``CompletionForwarder.plain``), taken by the completion pipeline for a
call that carries nothing but OpenAI's fields or an ``agentclaims`` object with nothing to
carry: called with the call's kind and body (and its tenant's ``cache_salt`` and
``request_id``; for the SDK's call, ``fresh_pool_s``: how old the pool figures it answers with
may be); ``None`` when it will not take the call (an operation waits to ride, or the figures
are older), a ``Written`` to answer the general way, else a ``PlainReply``."""


class ReplyStream(Protocol):
    """A streamed reply, passed on as the engine produces it."""

    async def start(self) -> ServeResult | None:
        """Waits for the first token: the KV life of a request ended before it (refused)."""
        ...

    def batches(self) -> AsyncIterator[list[dict[str, Any]]]:
        """The reply's chunks, those that came together in one (never an empty) list."""
        ...

    result: ServeResult | None
    """The request's KV life, once ``batches`` ended."""

    @property
    def usage(self) -> dict[str, Any] | None: ...

    @property
    def shape(self) -> dict[str, Any]:
        """The fields every chunk repeats (``id``, ``object``, ``created``, ``model``)."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class ReplyWriter(Protocol):
    """Writes completions' replies (and serves their KV life with their claims)."""

    @property
    def model_name(self) -> str:
        """The model ``/v1/models`` names."""
        ...

    @property
    def streams(self) -> bool:
        """Whether tokens pass on as they are produced (else a streamed request is answered
        whole, then sent as events)."""
        ...

    @property
    def streams_claims(self) -> bool:
        """Whether a streamed call may carry claims (their answer read aside)."""
        ...

    def prepare(self, call: CompletionCall) -> CompletionCall:
        """The call checked (bad input raises ``UsageError`` before anything changes), with
        what the writer learned on the way (``segments``)."""
        ...

    async def write(self, call: CompletionCall) -> Written:
        """The reply to a call ``prepare`` returned, with its KV life."""
        ...

    async def stream(self, call: CompletionCall) -> ReplyStream:
        """The same, streamed as it is produced (where ``streams``)."""
        ...


def check_body(kind: str, body: Mapping[str, Any]) -> None:
    """The shape every writer needs, checked before anything changes (a release the call
    carries included): a chat's ``messages`` a non-empty list of objects and its ``tools`` a
    list of objects; a completion's ``prompt`` a non-empty string, a one-string list or a list
    of token ids."""
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise UsageError("messages", "must be a non-empty list of messages")
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping):
                raise UsageError(f"messages[{i}]", f"expected an object, got {m!r}")
        tools = body.get("tools")
        tools = [] if tools is None else tools
        if not isinstance(tools, list) or not all(isinstance(t, Mapping) for t in tools):
            raise UsageError("tools", "must be a list of tool objects")
    elif kind == "completion":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        ok = (isinstance(prompt, str) and prompt) or (
            isinstance(prompt, list)
            and prompt
            and all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31 for t in prompt
            )
        )
        if not ok:
            raise UsageError(
                "prompt", "must be a non-empty string (or one-string list) or a list of token ids"
            )
    else:
        raise UsageError("kind", f"unknown completion kind {kind!r}")


@dataclass(frozen=True, slots=True)
class QueueFigures:
    """Means over the requests an engine scheduled lately (``QueueTimes``)."""

    wait_s: float
    """Arrival to first scheduled."""
    prefill_s: float
    """First scheduled to first token."""
    token_s: float | None = None
    """Prefill time per token computed (cached ones not counted); ``None`` where the engine
    does not say how many it computed."""


class QueueTimes(Protocol):
    """How long an engine's queue and prefills lately took, where a writer's engine orders
    calls by priority (``VllmKV.engine_queue``; the gateway's promotions weigh them)."""

    @property
    def latest(self) -> QueueFigures | None:
        """The figures as the last read left them (``None``: none yet); reads nothing."""
        ...

    def figures(self) -> QueueFigures | None:
        """The latest figures; may start a read of fresher ones."""
        ...

    async def aclose(self) -> None: ...
