"""Test your agent code against claims without a server (as httpx's ``MockTransport`` and
structlog's ``capture_logs`` let you test against HTTP and logs).

- ``ForwardingBackend``: the claims protocol forwarded to another backend; subclass it to
  inject one fault in front of a real engine.
"""

from agentclaims.testing.forwarding import ForwardingBackend

__all__ = ["ForwardingBackend"]
