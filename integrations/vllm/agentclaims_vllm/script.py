"""Make a random-weight model follow a script: a vLLM logits processor for tests and demos.

The tiny model (``agentclaims_vllm.tiny_model``) has random weights, so on its own it never
calls a tool. Its chat template writes, where the request offers tools, what a well-behaved
agent model would answer between two markers at the end of the prompt::

    <|script|><tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call><|/script|>

(a call of the first tool, with each required argument filled in, after a user's turn; the
tool's result, quoted, after a tool's turn). This processor makes the model say exactly that:
at each step every logit but the script's next token is set to minus infinity, and after the
script, the end-of-sequence token. vLLM's own tool-call parser (``--tool-call-parser
hermes``) then turns the text into an OpenAI tool call, as it would for a real model.

Load it with vLLM's own flag::

    --logits-processors agentclaims_vllm.script:FollowScript

A prompt without the markers (every request that offers no tools) is left alone: the model's
logits pass unchanged. A tokenizer without the markers (any other model) makes the processor
do nothing at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

from agentclaims_vllm.tiny_model import CLOSE, OPEN, script_of

if TYPE_CHECKING:
    import torch
    from vllm import SamplingParams
    from vllm.config import VllmConfig

__all__ = ["FollowScript"]


class FollowScript(AdapterLogitsProcessor):
    """vLLM's per-request adapter around ``_Follower``: one per request whose prompt holds a
    script (read once, at its first step)."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool):
        super().__init__(vllm_config, device, is_pin_memory)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(vllm_config.model_config.tokenizer)
        vocab = tokenizer.get_vocab()
        self._ids = (
            (vocab[OPEN], vocab[CLOSE], tokenizer.eos_token_id)
            if OPEN in vocab and CLOSE in vocab and tokenizer.eos_token_id is not None
            else None
        )

    def is_argmax_invariant(self) -> bool:
        return False  # it decides the argmax

    def new_req_logits_processor(self, params: SamplingParams) -> Callable[..., Any] | None:
        return None if self._ids is None else _Follower(*self._ids)


class _Follower:
    """One request's script: the next token forced at each step, then end of sequence."""

    def __init__(self, open_id: int, close_id: int, eos_id: int) -> None:
        self._marks = (open_id, close_id)
        self._eos = eos_id
        self._script: list[int] | None = None
        self._read = False

    def __call__(self, prompt: list[int], output: list[int], logits: torch.Tensor) -> torch.Tensor:
        if not self._read:
            self._script, self._read = script_of(prompt, *self._marks), True
        script = self._script
        if script is None:
            return logits
        step = len(output)
        token = script[step] if step < len(script) else self._eos
        logits.fill_(float("-inf"))
        logits[token] = 0.0
        return logits
