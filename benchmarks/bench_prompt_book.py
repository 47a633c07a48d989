"""What the vLLM side's prompt book holds in memory as agents' conversations go through it: a
script that prints figures; no test times or sizes anything.

Each call's answer comes as the gateway gets it from vLLM (JSON with the prompt's and the
reply's token ids, parsed by the gateway's codec) and is booked as the gateway books a plain
call: the prompt's and the sequence's block hashes (``PromptBook.chains``) and both prefixes
(``forwarding.book``). ``--agents`` conversations of ``--tokens`` tokens each take turns; a
turn drops the conversation's oldest 48 tokens and adds 48 (its length stays, its prefixes
are new). The book's memory is what ``tracemalloc`` sees it allocate and keep; it is
printed every ``--every`` calls, with the book's own count of tokens and prefixes, under
the default bound (``MAX_TOKENS``) and, with ``--unbounded``, under the count bound alone::

    .venv/bin/python benchmarks/bench_prompt_book.py [--calls 12000] [--tokens 900] [--unbounded]
"""

from __future__ import annotations

import argparse
import random
import time
import tracemalloc

from agentclaims._json import dumps, loads
from agentclaims.engine.blocks import pack_tokens
from agentclaims.vllm.forwarding import book
from agentclaims.vllm.payloads import packed_sequence
from agentclaims.vllm.prompts import MAX_TOKENS, PromptBook

BLOCK = 32
TURN = 48


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=12_000)
    parser.add_argument("--tokens", type=int, default=900, help="each conversation's length")
    parser.add_argument("--agents", type=int, default=6)
    parser.add_argument("--every", type=int, default=2_000)
    parser.add_argument(
        "--unbounded", action="store_true", help="no bound on tokens: 100,000 prefixes only"
    )
    args = parser.parse_args()
    if min(args.calls, args.tokens, args.agents, args.every) < 1 or args.tokens <= TURN:
        parser.error(f"--calls, --agents and --every must be >= 1, --tokens > {TURN}")
    most = 10**12 if args.unbounded else MAX_TOKENS
    prompts = PromptBook(BLOCK, 100_000, most)
    rng = random.Random(0)
    conversations = [
        [rng.randrange(1_000, 50_000) for _ in range(args.tokens)] for _ in range(args.agents)
    ]
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    started = time.perf_counter()
    bound = "none" if args.unbounded else f"{MAX_TOKENS:,} tokens"
    print(f"{args.agents} conversations of {args.tokens} tokens, blocks of {BLOCK}; bound {bound}")
    print(
        f"{'calls':>8}{'held MB':>10}{'kB a call':>11}{'B a token':>11}{'tokens':>12}{'prefixes':>10}"
    )
    for call in range(1, args.calls + 1):
        agent = call % args.agents
        turn = [rng.randrange(1_000, 50_000) for _ in range(TURN)]
        conversations[agent] = conversations[agent][TURN:] + turn
        raw = dumps({"prompt_token_ids": conversations[agent], "token_ids": [7, 8, 9, 10]})
        data = loads(raw)  # as the gateway parses vLLM's answer: ids of its own
        tokens = pack_tokens(data["prompt_token_ids"])
        sequence = packed_sequence({"choices": [data]}, tokens, BLOCK)
        hashes, seq_hashes = prompts.chains(tokens, sequence, None)
        book(prompts, tokens, hashes, None, sequence, seq_hashes, None)
        if call % args.every == 0 or call == args.calls:
            held = tracemalloc.get_traced_memory()[0] - base
            print(
                f"{call:>8}{held / 1e6:>10.1f}{held / call / 1e3:>11.1f}"
                f"{held / max(1, prompts.tokens):>11.1f}{prompts.tokens:>12,}{len(prompts):>10,}"
            )
    print(f"\n{time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
