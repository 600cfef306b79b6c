"""``hetero bench-serve --dataset-name multi-turn``: conversations that keep their history and share a prefix, in
the manner of production-stack's multi-round QA benchmark.

``--multi-turn-users`` U users share one system prompt (``--multi-turn-system-len``); each has its own context
(``--multi-turn-history-len``, e.g. a document it asks about) and asks ``--multi-turn-rounds`` R questions
(``--multi-turn-question-len`` each), one at a time: round r's prompt is the system prompt, the user's context, every
earlier question and the answer the server gave to it, then question r. Answers are ``--random-output-len`` tokens at
most. Users arrive at ``--request-rate`` (gamma gaps of ``--burstiness``, as the random dataset's requests do); a
user sends its next round as soon as its answer is in; ``--max-concurrency`` caps the requests in flight. The prompts
are seeded, so the prefix a prompt shares with earlier ones is exact: a server's prefix cache (or a router that sends
a user back where its history is cached) shows in the hit rate and the TTFT.

``--multi-turn-format text`` (the default): the prompts are strings of words drawn from ``WORDS`` (lengths in words,
each with a leading space), the server tokenizes them, and an answer is its text. ``tokens``: for checkpoints without
a tokenizer, the prompts are token ids below ``--vocab-size`` (lengths in tokens) and an answer is its token ids,
asked for with ``return_token_ids``; vllm-router's kv_aware policy cannot score such requests (it gives no prefix
credit to a request carrying a field it does not know, and routes them by load alone).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import random
import time
from dataclasses import dataclass
from typing import Any, Sequence

from hetero.bench.serve import RequestResult, RequestSpec, stream_completion
from hetero.errors import UsageError

__all__ = [
    "WORDS",
    "FORMATS",
    "Conversation",
    "Turn",
    "conversations",
    "run_multi_turn",
    "add_multi_turn_args",
    "from_args",
]


WORDS = tuple(
    "time year people way day man thing woman life child world school state family student group country problem "
    "hand part place case week company system program question work government number night point home water room "
    "mother area money story fact month lot right study book eye job word business issue side kind head house "
    "service friend father power hour game line end member law car city name team minute idea kid body".split()
)
FORMATS = ("text", "tokens")


@dataclass(frozen=True)
class Conversation:
    """One user's script: the shared system prompt, its own context, its questions (text, or token ids)."""

    system: str | list[int]
    history: str | list[int]
    questions: list[str] | list[list[int]]


@dataclass(frozen=True)
class Turn:
    """One request of a conversation as sent: the whole prompt and the answer (text, or token ids)."""

    user: int
    round: int
    prompt: str | list[int]
    answer: str | list[int]


def conversations(
    users: int,
    rounds: int,
    system_len: int,
    history_len: int,
    question_len: int,
    seed: int,
    fmt: str = "text",
    vocab: int = 1000,
) -> list[Conversation]:
    """``users`` conversations of ``rounds`` questions over one system prompt, seeded: lengths in words of ``WORDS``
    (format text), or in token ids in [1, vocab) (format tokens)."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt: expected one of {FORMATS}, got {fmt!r}")
    rng = random.Random(seed)

    def ids(n: int) -> str | list[int]:
        if fmt == "text":
            return "".join(" " + rng.choice(WORDS) for _ in range(n))
        return [rng.randrange(1, vocab) for _ in range(n)]

    system = ids(system_len)
    return [Conversation(system, ids(history_len), [ids(question_len) for _ in range(rounds)]) for _ in range(users)]


async def run_multi_turn(
    client: Any,
    model: str,
    convs: Sequence[Conversation],
    output_len: int,
    gaps: Sequence[float],
    max_concurrency: int | None,
    ignore_eos: bool,
) -> tuple[list[RequestResult], float, list[Turn]]:
    """Play every conversation, user i arriving after ``sum(gaps[:i + 1])`` seconds; (results, seconds, turns),
    user by user, round by round. A failed round ends its user's conversation: its later rounds count as failed."""
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()

    async def user(index: int, conv: Conversation, start: float) -> list[tuple[RequestResult, Turn]]:
        await asyncio.sleep(start)
        context, done = conv.system + conv.history, []
        tokens = not isinstance(conv.system, str)
        for r, question in enumerate(conv.questions):
            prompt, pieces = context + question, []
            spec = RequestSpec(prompt, output_len)
            async with limit:
                result = await stream_completion(client, model, spec, ignore_eos, pieces, token_ids=tokens)
            if tokens and result.ok and not pieces:
                result.ok, result.error = False, "the server returned no token ids (return_token_ids)"
            answer = pieces if tokens else "".join(pieces)
            done.append((result, Turn(index, r, prompt, answer)))
            if not result.ok:
                skipped = RequestResult(False, 0, error=f"skipped: an earlier round failed ({result.error[:100]})")
                done += [(skipped, Turn(index, k, prompt[:0], answer[:0])) for k in range(r + 1, len(conv.questions))]
                break
            context = prompt + answer
        return done

    begin = time.perf_counter()
    starts = itertools.accumulate(gaps)
    played = await asyncio.gather(*(user(i, conv, start) for i, (conv, start) in enumerate(zip(convs, starts))))
    pairs = [pair for one in played for pair in one]
    return [r for r, _ in pairs], time.perf_counter() - begin, [t for _, t in pairs]


def add_multi_turn_args(p: argparse.ArgumentParser) -> None:
    """bench-serve's ``--multi-turn-*`` flags."""
    g = p.add_argument_group(
        "multi-turn dataset (--dataset-name multi-turn: users x rounds requests, --num-prompts unused)"
    )
    g.add_argument(
        "--multi-turn-format",
        choices=FORMATS,
        default="text",
        help="text: prompts of words, the server tokenizes them, lengths in words (default); tokens: token ids and "
        "return_token_ids, for a checkpoint without a tokenizer (vllm-router's kv_aware cannot score these)",
    )
    g.add_argument("--multi-turn-users", type=int, default=8, help="conversations (default 8)")
    g.add_argument("--multi-turn-rounds", type=int, default=4, help="questions per conversation (default 4)")
    g.add_argument("--multi-turn-system-len", type=int, default=256, help="shared system prompt length (default 256)")
    g.add_argument("--multi-turn-history-len", type=int, default=64, help="each user's own context length (default 64)")
    g.add_argument("--multi-turn-question-len", type=int, default=32, help="length of a question (default 32)")


def from_args(args: argparse.Namespace, vocab: int) -> list[Conversation]:
    """The conversations of bench-serve's flags (output length: ``--random-output-len``; token ids below vocab)."""
    sizes = {
        "--multi-turn-users": args.multi_turn_users,
        "--multi-turn-rounds": args.multi_turn_rounds,
        "--multi-turn-question-len": args.multi_turn_question_len,
        "--random-output-len": args.random_output_len,
    }
    lens = {
        "--multi-turn-system-len": args.multi_turn_system_len,
        "--multi-turn-history-len": args.multi_turn_history_len,
    }
    if any(v < 1 for v in sizes.values()) or any(v < 0 for v in lens.values()):
        raise UsageError(f"arguments {', '.join(sizes)}: expected >= 1, and {', '.join(lens)} >= 0; got {sizes | lens}")
    return conversations(
        args.multi_turn_users,
        args.multi_turn_rounds,
        args.multi_turn_system_len,
        args.multi_turn_history_len,
        args.multi_turn_question_len,
        args.seed,
        args.multi_turn_format,
        vocab,
    )
