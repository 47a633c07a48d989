"""The workflow side of agentclaims: the Agent Execution Graph and its reuse model.

* :class:`AgentExecutionGraph`: steps, transitions, observed counts, AND-joins (networkx).
* :func:`steps_to_execution` (``ste``), :func:`reuse_within` (``reuse``), :class:`SteTracker`
  (``tracker``): KVFlow's steps-to-execution per node and per prefix, and the probability that
  a prefix is reused within a horizon.
* :class:`ToolTimeModel`: tool durations and Continuum's pin TTL.
* :class:`EngineCosts`: the per-block recompute time, learned from the engine's answers.
* :class:`GraphRegistry`: graphs declared with decorators.

The LangGraph binding lives in ``agentclaims.bindings.langgraph`` (LangGraph is optional).
"""

from __future__ import annotations

from agentclaims.graph.aeg import (
    END,
    START,
    AgentExecutionGraph,
    AgentGraphWarning,
    EdgeKind,
    GraphWarning,
    NodeKind,
)
from agentclaims.graph.costs import EngineCosts
from agentclaims.graph.decorators import GraphRegistry
from agentclaims.graph.reuse import Reuse, prefix_reuse, reuse_within
from agentclaims.graph.ste import (
    SteSnapshot,
    kvflow_priority,
    prefix_steps_to_execution,
    steps_to_execution,
)
from agentclaims.graph.tooltime import ToolTimeModel
from agentclaims.graph.tracker import SteTracker

__all__ = [
    "END",
    "START",
    "AgentExecutionGraph",
    "AgentGraphWarning",
    "EdgeKind",
    "EngineCosts",
    "GraphRegistry",
    "GraphWarning",
    "NodeKind",
    "Reuse",
    "SteSnapshot",
    "SteTracker",
    "ToolTimeModel",
    "kvflow_priority",
    "prefix_reuse",
    "prefix_steps_to_execution",
    "reuse_within",
    "steps_to_execution",
]
