"""Test your agent code against claims without a server (as httpx's ``MockTransport`` and
structlog's ``capture_logs`` let you test against HTTP and logs). ``import agentclaims`` never
imports this package.

- ``FakeBackend``: the real gateway app in front of a ``FakeKV``, in-process; the OpenAI client
  and ``ClaimedSession`` work unchanged, ``.kv`` is the fake you script::

      backend = FakeBackend(script=lambda r: Reply.tool("search"))
      backend.kv.refuse_claims(mode="hard_protected", reason="no_room")
      client = agentclaims.openai_client(backend)

- ``FakeKV``: an in-memory KV side speaking the claims protocol and ``ActiveServing``; it
  records every call (``calls``, ``calls_of``) and does what it is told::

      kv = FakeKV(num_blocks=64, block_size=16)
      kv.defer_requests(n=1, retry_after_s=0.5)   # also refuse_requests, demote, expire, harm
      backend = FakeBackend(kv=kv)

  Its lowering descriptor (``fake_descriptor()``) honours every mode but ``offloadable``; give
  ``FakeKV(lowering=...)`` another to test agent code on a runtime that honours less.

- ``Call``: one recorded call, its ``operation`` and ``args``::

      [call] = backend.kv.calls_of("release_claim")
      assert call.claim_id == held.claim_id
      assert call.args["owner_scope"] == session.owner_scope

- ``OutcomeLog``: a text stream to pass as ``log_stream=``; it keeps the outcome log's lines
  parsed (``lines``, ``of``, ``reactions``, ``claim_story``), also after it is closed::

      log = OutcomeLog()
      async with ClaimedSession(backend, log_stream=log): ...
      assert log.reactions("replan") and log.of("llm_call")

- ``ForwardingBackend``: the claims protocol forwarded to another backend; subclass it to
  inject one fault in front of a real engine::

      class NoEvents(ForwardingBackend):
          async def events(self, since=0, *, id_prefix=None, limit=None):
              return EventPage((), 0, since)
"""

from agentclaims.testing.capture import OutcomeLog
from agentclaims.testing.fake import Call, FakeBackend, FakeKV, fake_descriptor
from agentclaims.testing.forwarding import ForwardingBackend

__all__ = ["Call", "FakeBackend", "FakeKV", "ForwardingBackend", "OutcomeLog", "fake_descriptor"]
