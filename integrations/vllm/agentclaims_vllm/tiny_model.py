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
from pathlib import Path

VOCAB_SIZE = 2048
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
    fast.chat_template = (
        "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant: {% endif %}"
    )
    if len(fast) < VOCAB_SIZE:
        raise RuntimeError(f"the tokenizer learned only {len(fast)} of {VOCAB_SIZE} tokens")
    fast.save_pretrained(out)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
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
