"""Fixtures for gateway tests."""

from __future__ import annotations

import pytest
from gateway_sleeps import RecordingSleep


@pytest.fixture
def sleep() -> RecordingSleep:
    return RecordingSleep()
