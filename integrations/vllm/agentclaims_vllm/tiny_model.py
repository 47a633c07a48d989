"""Build the tiny random-weight Llama and byte-level BPE tokenizer the tests serve (no hub).

Run in the vLLM server's environment (it needs ``transformers`` and ``tokenizers``)::

    python -m agentclaims_vllm.tiny_model DIR

About 6 s and 2 MB. The output is gibberish; serve it with temperature 0 and ``ignore_eos``
for deterministic lengths. Head size 32 (the CPU attention supports 32, 64, 80, ...).
``--layers`` and ``--hidden`` make it deeper and wider (2 and 128 by default): a model whose
decode step is more than vLLM's own per-step work, for throughput benchmarks.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

VOCAB_SIZE = 2048
"""The ids BPE learns (any id below it is a valid prompt token); the added tokens follow."""
OPEN = "<|script|>"
CLOSE = "<|/script|>"
"""Where the chat template writes what the model is to say (``agentclaims_vllm.script``)."""
TOOL_TOKENS = ("<tool_call>", "</tool_call>")
"""Hermes's tool-call marks, tokens of their own as vLLM's ``hermes`` parser expects."""

_CHAT_TEMPLATE = (
    "".join(
        line.lstrip()
        for line in r"""
    {% for m in messages %}<s>{{ m['role'] }}: {% if m['tool_calls'] %}
    {% for c in m['tool_calls'] %}<tool_call>{{ c['function']['name'] }}</tool_call>{% endfor %}
    {% endif %}{{ m['content'] }}{{ '\n' }}{% endfor %}
    {% if add_generation_prompt %}{% if tools %}OPEN
    {% if messages[-1]['role'] == 'tool' %}result: {{ messages[-1]['content'] }}{% else %}
    {% set f = tools[0]['function'] %}
    {% set p = f['parameters'] or {} %}
    {% set ns = namespace(args='') %}
    {% for name in (p['required'] or []) %}
    {% set kind = ((p['properties'] or {})[name] or {})['type'] %}
    {% set value = {'integer': '1', 'number': '1', 'boolean': 'true'}[kind] or '"x"' %}
    {% set ns.args = ns.args ~ (', ' if ns.args else '') ~ (name | tojson) ~ ': ' ~ value %}
    {% endfor %}
    <tool_call>{"name": {{ f['name'] | tojson }}, "arguments": {{ '{' ~ ns.args ~ '}' }}}
    </tool_call>{% endif %}CLOSE{% endif %}<s>assistant: {% endif %}
    """.splitlines()
    )
    .replace("OPEN", OPEN)
    .replace("CLOSE", CLOSE)
)
"""The tool-less prompt renders as it always did; see ``agentclaims_vllm.script``."""


def script_of(prompt: Sequence[int], open_id: int, close_id: int) -> list[int] | None:
    """The token ids between the prompt's last ``OPEN`` and the ``CLOSE`` after it, or
    ``None`` where the prompt carries no (whole) script."""
    for start in range(len(prompt) - 1, -1, -1):
        if prompt[start] == open_id:
            rest = list(prompt[start + 1 :])
            return rest[: rest.index(close_id)] if close_id in rest else None
    return None


_CORPUS = (
    "the agent calls a tool and waits for the result then the agent reads the result and "
    "answers the user a claim keeps the prefix of the conversation resident while the tool "
    "runs so the next call reuses the cache instead of computing the prompt again "
)


def _corpus() -> list[str]:
    """Enough distinct text that the BPE vocabulary fills all ``VOCAB_SIZE`` ids (any token id
    below it is then a valid prompt token)."""
    import random

    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(6000)]
    return [_CORPUS * 20, *(" ".join(words[i : i + 12]) for i in range(0, len(words), 12))]


HEAD_DIM = 32


def build(directory: str | Path, *, seed: int = 0, layers: int = 2, hidden: int = 128) -> Path:
    """Write the tokenizer and model to ``directory`` (created); returns it. ``hidden``: a
    multiple of 64 (heads of 32, half as many KV heads), the MLP twice as wide."""
    if not (isinstance(layers, int) and layers >= 1):
        raise ValueError(f"layers must be a positive integer, got {layers!r}")
    if not (isinstance(hidden, int) and hidden >= 64 and hidden % 64 == 0):
        raise ValueError(f"hidden must be a positive multiple of 64, got {hidden!r}")
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    if len(fast) < VOCAB_SIZE:
        raise RuntimeError(f"the tokenizer learned only {len(fast)} of {VOCAB_SIZE} tokens")
    # after the learned ids, so the ids below VOCAB_SIZE and BPE's merges stay as they were
    fast.add_tokens(list(TOOL_TOKENS))
    fast.add_special_tokens({"additional_special_tokens": [OPEN, CLOSE]})
    fast.chat_template = _CHAT_TEMPLATE
    fast.save_pretrained(out)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // HEAD_DIM,
        num_key_value_heads=hidden // HEAD_DIM // 2,
        head_dim=HEAD_DIM,
        max_position_embeddings=2048,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        torch_dtype="bfloat16",
    )
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentclaims_vllm.tiny_model", description=__doc__)
    parser.add_argument("directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128, help="a multiple of 64")
    args = parser.parse_args(argv)
    try:
        path = build(args.directory, seed=args.seed, layers=args.layers, hidden=args.hidden)
    except ValueError as exc:
        parser.error(str(exc))
    print(path, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
