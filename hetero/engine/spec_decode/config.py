"""``speculative_config``: vLLM's keys, checked at once."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from hetero.errors import UsageError

__all__ = ["SpeculativeConfig", "METHODS"]

#: method -> the keys it takes besides ``method`` and ``num_speculative_tokens``
METHODS = {
    "ngram": ("prompt_lookup_min", "prompt_lookup_max"),
    "draft_model": ("model",),
    "mtp": (),
    "eagle3": ("model",),
}


def _bad(key: str, expected: str, got: Any) -> UsageError:
    return UsageError(
        f"speculative_config: argument {key!r}: expected {expected}, got {got!r}",
        arg=f"speculative_config.{key}",
        expected=expected,
        got=got,
    )


def _int(cfg: dict, key: str, default: int | None, least: int) -> int | None:
    value = cfg.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise _bad(key, f"an integer >= {least}", value)
    return value


@dataclass(frozen=True)
class SpeculativeConfig:
    """How a request's next tokens are drafted and verified.

    - ``method``: "ngram" (the longest suffix of the request's tokens, between
      ``prompt_lookup_min`` and ``prompt_lookup_max`` tokens, that occurred before: the tokens that
      followed its latest earlier occurrence), "draft_model" (``model``: a checkpoint directory with
      the target's vocabulary), "mtp" (the target checkpoint's own next-token layers) or "eagle3"
      (``model``: an EAGLE-3 draft head in the layout vLLM loads).
    - ``num_speculative_tokens``: k, the tokens drafted per request and step (>= 1).

    ``of(value)`` reads a dict, a JSON string or None (no speculation); keys that do not belong to the
    method, and unknown keys, are refused by name.
    """

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 5
    model: str | None = None

    @classmethod
    def of(cls, value: Any) -> "SpeculativeConfig | None":
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise _bad("speculative_config", "a JSON object", value) from e
        if not isinstance(value, dict):
            raise _bad("speculative_config", "a dict (or JSON object) with 'method'", value)
        method = value.get("method")
        if method not in METHODS:
            raise _bad("method", f"one of {', '.join(METHODS)}", method)
        allowed = {"method", "num_speculative_tokens", *METHODS[method]}
        for key in value:
            if key not in allowed:
                raise _bad(key, f"one of {', '.join(sorted(allowed))} for method {method!r}", value[key])
        k = _int(value, "num_speculative_tokens", None, 1)
        if k is None:
            raise _bad("num_speculative_tokens", "an integer >= 1", None)
        fields: dict[str, Any] = {"method": method, "num_speculative_tokens": k}
        if method == "ngram":
            lo = _int(value, "prompt_lookup_min", 1, 1)
            hi = _int(value, "prompt_lookup_max", max(lo, 5), 1)
            if hi < lo:
                raise _bad("prompt_lookup_max", f"an integer >= prompt_lookup_min ({lo})", hi)
            fields.update(prompt_lookup_min=lo, prompt_lookup_max=hi)
        if "model" in METHODS[method]:
            model = value.get("model")
            if not isinstance(model, (str, os.PathLike)) or not os.path.isdir(model):
                raise _bad("model", "an existing checkpoint directory", model)
            fields["model"] = str(model)
        return cls(**fields)

    @property
    def uses_model(self) -> bool:
        """Whether drafting runs a model (every method but n-gram), after each step and on every rank."""
        return self.method != "ngram"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens}
        d.update({k: getattr(self, k) for k in METHODS[self.method]})
        return d
