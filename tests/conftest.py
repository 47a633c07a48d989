"""What every test starts from: no shared view of any engine's pool. ``PoolShare`` is per
process (the sessions of one process share each engine's learned block cost, its figures,
its holds and its admission window), so a test would otherwise plan with what the tests
before it taught."""

from __future__ import annotations

import pytest

from agentclaims.session.poolshare import PoolShare


@pytest.fixture(autouse=True)
def _fresh_pool_shares() -> None:
    PoolShare.forget_all()
