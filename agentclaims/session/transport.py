"""The HTTP transport that carries claims on every LLM call.

Give it to the OpenAI client (or LangChain's ``ChatOpenAI``) and every completion request made
inside a ``ClaimedSession`` is tagged with the session, workflow and node (read from LangGraph's
run metadata when the call happens inside a graph node, so prebuilt agents work unmodified),
sent to the session's backend, and its outcome handled: deferrals waited out, refusals answered
by the session's reaction policy, and the answer's prefix ids turned into the next claim.
Requests made outside any session pass straight through to the default backend.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import httpx2

from agentclaims.contract import ArbiterAction
from agentclaims.errors import BackendUnavailable, ClaimRefused, DeadlineExceeded
from agentclaims.protocol import EXTENSION_KEY, ActiveOutcome, outcome_from_error
from agentclaims.session.reactions import RetryRequested
from agentclaims.session.session import ClaimedSession, current_session

if TYPE_CHECKING:
    import tenacity

    from agentclaims.backends.base import Backend

__all__ = ["ClaimsTransport"]

_COMPLETIONS = ("/chat/completions", "/completions")
_DROP_HEADERS = ("content-encoding", "content-length", "transfer-encoding")


def _langgraph_metadata() -> Mapping[str, Any] | None:
    """LangChain's current run config metadata, if LangChain is in use (never imports it)."""
    module = sys.modules.get("langchain_core.runnables.config")
    if module is None:
        return None
    config = module.var_child_runnable_config.get()
    if not config:
        return None
    metadata = config.get("metadata")
    return metadata if isinstance(metadata, Mapping) else None


class ClaimsTransport(httpx2.AsyncBaseTransport):
    """An ``httpx2`` transport over a default backend (used when no session is active)."""

    def __init__(self, backend: Backend) -> None:
        self.default = backend

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        session = current_session()
        suffix = self._suffix(request)
        if session is None or request.method != "POST" or not suffix.endswith(_COMPLETIONS):
            return await self._forward(self.default, request, suffix, None)
        body = json.loads(await request.aread() or b"{}")
        metadata = _langgraph_metadata()
        node = session.current_node(metadata)
        step = None if metadata is None else metadata.get("langgraph_step")
        await session.settle()
        ext = session.before_call(node, step)
        body[EXTENSION_KEY] = {**(body.get(EXTENSION_KEY) or {}), **ext}
        started = session.clock()
        response = await self._send_with_reactions(session, request, suffix, body)
        content = await response.aread()
        if response.status_code == 200:
            data = json.loads(content)
            message = (data.get("choices") or [{}])[0].get("message") or {}
            tools = [
                c["function"]["name"] for c in message.get("tool_calls") or () if "function" in c
            ]
            await session.after_call(
                node,
                data.get(EXTENSION_KEY) or {},
                data.get("usage") or {},
                latency_s=session.clock() - started,
                tool_names=tools,
                request_id=data.get("id"),
            )
        headers = [(k, v) for k, v in response.headers.items() if k.lower() not in _DROP_HEADERS]
        return httpx2.Response(
            response.status_code, headers=headers, content=content, request=request
        )

    async def _send_with_reactions(
        self, session: ClaimedSession, request: httpx2.Request, suffix: str, body: dict[str, Any]
    ) -> httpx2.Response:
        def before_sleep(state: tenacity.RetryCallState) -> None:
            delay = state.next_action.sleep if state.next_action is not None else 0.0
            session.stats.deferrals += 1
            session.stats.deferral_s += delay
            exc = state.outcome.exception() if state.outcome is not None else None
            outcome = exc.outcome.to_dict() if isinstance(exc, RetryRequested) else None
            session.log_reaction(
                "defer", outcome=outcome, delay_s=round(delay, 6), attempt=state.attempt_number
            )

        try:
            async for attempt in session.reaction.retrying(
                session.sleep, before_sleep, session.clock
            ):
                with attempt:
                    response = await self._forward_routed(session, request, suffix, body)
                    if response.status_code in (409, 503):
                        raw = await response.aread()
                        try:
                            parsed = json.loads(raw)
                        except json.JSONDecodeError:
                            parsed = {}
                        outcome = outcome_from_error(parsed)
                        if outcome is not None:
                            await self._react(session, outcome)
                    session.note_call(retried=attempt.retry_state.attempt_number > 1)
                    return response
        except RetryRequested as exc:
            session.stats.fails += 1
            session.log_reaction("fail", outcome=exc.outcome.to_dict(), reason="deadline")
            raise DeadlineExceeded(
                f"deferred past the {session.reaction.deadline_s}s deadline: "
                + exc.outcome.describe(),
                outcome=exc.outcome,
            ) from None
        raise AssertionError("unreachable: the retry loop returns or raises")

    async def _forward_routed(
        self, session: ClaimedSession, request: httpx2.Request, suffix: str, body: dict[str, Any]
    ) -> httpx2.Response:
        """Forward to the session's backend; behind a router, an instance that does not
        answer (a transport error, or a 5xx that is not a claim outcome) is failed over to
        another (``ClaimedSession.failover``), a bounded number of times."""
        while True:
            backend = session.backend
            key = getattr(backend, "key", None)  # a fleet's routing key: also the body's user
            if isinstance(key, str) and str(body.get("user", key)).startswith(session.session_id):
                body["user"] = key
            try:
                response = await self._forward(backend, request, suffix, body)
            except BackendUnavailable as exc:
                if await session.failover(str(exc)):
                    continue
                raise
            failed = response.status_code >= 500
            if failed and outcome_from_error(_json(await response.aread())) is None:
                reason = f"HTTP {response.status_code} from {backend.name}"
                if await session.failover(reason):
                    continue
            return response

    async def _react(self, session: ClaimedSession, outcome: ActiveOutcome) -> None:
        """Decide what to do with a refusal: raise RetryRequested to try again, or fail."""
        policy = session.reaction.on_refused
        if policy == "fail" or outcome.action is ArbiterAction.CAPACITY_REQUIRED:
            session.stats.fails += 1
            session.log_reaction("fail", outcome=outcome.to_dict())
            raise ClaimRefused(outcome.describe(), outcome=outcome)
        own = [cid for cid in outcome.blocking_claim_ids if cid.startswith(session.session_id)]
        if own and await session.relax_claims(own):
            raise RetryRequested(outcome, 0.0)  # a session never waits on its own claims
        if outcome.deferred:
            raise RetryRequested(outcome, outcome.retry_after_s)
        if policy == "reroute" and await session.reroute(outcome):
            raise RetryRequested(outcome, 0.0)
        raise RetryRequested(outcome, outcome.retry_after_s)

    def _suffix(self, request: httpx2.Request) -> str:
        base = httpx2.URL(self.default.base_url).path.rstrip("/")
        path = request.url.path
        return path[len(base) :] if path.startswith(base) else path

    async def _forward(
        self, backend: Backend, request: httpx2.Request, suffix: str, body: dict[str, Any] | None
    ) -> httpx2.Response:
        client = backend.http_client()
        url = httpx2.URL(backend.base_url.rstrip("/") + suffix).copy_with(query=request.url.query)
        # a backend with its own API key sends it, not the caller's
        key = _api_key(backend)
        drop = {"host", "content-length"} | ({"authorization"} if key else set())
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in drop]
        if key:
            headers.append(("authorization", f"Bearer {key}"))
        content = json.dumps(body).encode() if body is not None else await request.aread()
        outgoing = client.build_request(request.method, url, headers=headers, content=content)
        try:
            return await client.send(outgoing)
        except httpx2.TransportError as exc:
            raise BackendUnavailable(f"backend {backend.name!r} unreachable: {exc!r}") from exc


def _api_key(backend: Backend) -> str | None:
    key = getattr(backend, "api_key", None)
    return key if isinstance(key, str) and key else None


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None
