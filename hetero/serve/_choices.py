"""One request's choice as the OpenAI API shapes it: text (with stop strings), logprobs, token ids,
streamed as deltas or returned whole."""

from __future__ import annotations

from hetero.engine import SamplingParams
from hetero.engine.outputs import RequestOutput

__all__ = ["Choice", "ChoiceStream", "sampling_params", "usage"]


def sampling_params(body, max_tokens: int, logprobs: int | None) -> SamplingParams:
    """The engine's parameters of an API request (values checked by SamplingParams: a 400 if bad)."""
    return SamplingParams(
        temperature=body.temperature,
        top_k=body.top_k,
        top_p=body.top_p,
        max_tokens=max_tokens,
        seed=body.seed,
        ignore_eos=body.ignore_eos,
        stop_token_ids=tuple(body.stop_token_ids),
        logprobs=logprobs,
    )


def usage(out: RequestOutput) -> dict:
    """OpenAI's usage, with ``prompt_tokens_details.cached_tokens``: the prompt tokens the prefix cache
    served (how a client, or a test, sees that a router sent the request where its prefix was)."""
    prompt, completion = len(out.prompt_token_ids), len(out.token_ids)
    cached = {"cached_tokens": int(out.metrics.get("num_cached_tokens", 0))}
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": cached,
    }


class Choice:
    """How a request's tokens become its choice: the tokenizer (None: text stays empty), the stop
    strings, whether token ids and logprobs are returned, and whether a stream ends with the usage."""

    def __init__(self, tokenizer, stop: str | list[str] | None, token_ids: bool, logprobs: bool, usage: bool = False):
        self.tokenizer, self.usage = tokenizer, usage
        self.stop = [stop] if isinstance(stop, str) else [s for s in (stop or []) if s]
        self.token_ids, self.logprobs = token_ids, logprobs

    def text(self, ids: list[int]) -> tuple[str, bool]:
        """(the text of ``ids`` cut before the first stop string, whether one was found)."""
        if self.tokenizer is None:
            return "", False
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cuts = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        return (text[: min(cuts)], True) if cuts else (text, False)

    def token(self, token_id: int) -> str:
        """The token's text, or ``token_id:N`` (vLLM's spelling) where it has none to show."""
        text = self.tokenizer.decode([token_id]) if self.tokenizer is not None else ""
        return text or f"token_id:{token_id}"


class ChoiceStream:
    """Feeds a request's outputs in order; ``delta`` is the choice chunk of each (None: nothing new
    to send yet), ``done`` once it finished or hit a stop string, ``result`` the whole choice."""

    def __init__(self, choice: Choice, chat: bool):
        self.choice, self.chat = choice, chat
        self.sent, self.ids, self.entries = "", [], []
        self.done, self.finish_reason = False, None
        self.last: RequestOutput | None = None

    def delta(self, out: RequestOutput) -> dict | None:
        self.last = out
        new_ids = list(out.new_token_ids)
        self.ids += new_ids
        entries = [self._logprob(t, lp) for t, lp in zip(new_ids, out.new_logprobs or [])]
        self.entries += entries
        text, stopped = self.choice.text(self.ids)
        if stopped or out.finished:
            self.done, self.finish_reason = True, "stop" if stopped else out.finish_reason
        else:
            # held back: a character not complete yet, and what could be the start of a stop string
            keep = len(text.rstrip("\ufffd")) - max((len(s) - 1 for s in self.choice.stop), default=0)
            text = text[: max(keep, len(self.sent))]
        new_text = text[len(self.sent) :] if text.startswith(self.sent) else ""
        self.sent += new_text
        if not (new_text or new_ids or self.done):
            return None
        chunk = {"index": 0, "logprobs": self._logprobs(entries), "finish_reason": self.finish_reason}
        if self.chat:
            chunk["delta"] = {"role": "assistant", "content": new_text}
        else:
            chunk["text"] = new_text
        if self.choice.token_ids:
            chunk["token_ids"] = new_ids
        return chunk

    def result(self) -> dict:
        """The whole choice after the last ``delta``."""
        body = {"index": 0, "logprobs": self._logprobs(self.entries), "finish_reason": self.finish_reason}
        if self.chat:
            body["message"] = {"role": "assistant", "content": self.sent}
        else:
            body["text"] = self.sent
        if self.choice.token_ids:
            body["token_ids"] = self.ids
            body["prompt_token_ids"] = list(self.last.prompt_token_ids) if self.last is not None else []
        return body

    def _logprob(self, token_id: int, top: dict) -> tuple[str, float, list[tuple[str, float]]]:
        sampled = top.get(token_id)
        return (
            self.choice.token(token_id),
            sampled.logprob if sampled is not None else float("-inf"),
            [(self.choice.token(t), lp.logprob) for t, lp in top.items()],
        )

    def _logprobs(self, entries: list) -> dict | None:
        if not self.choice.logprobs:
            return None
        if self.chat:
            return {
                "content": [
                    {
                        "token": tok,
                        "logprob": lp,
                        "bytes": list(tok.encode()),
                        "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in top],
                    }
                    for tok, lp, top in entries
                ]
            }
        return {
            "tokens": [e[0] for e in entries],
            "token_logprobs": [e[1] for e in entries],
            "top_logprobs": [dict(e[2]) for e in entries],
            "text_offset": [],
        }
