"""Speculative decoding: a proposer drafts k tokens per request, the target verifies 1 + k rows in one step.

``SpeculativeConfig`` (``LLM(speculative_config={...})``) picks the method; ``ngram`` drafts from the
request's own tokens, ``draft_model``, ``mtp`` and ``eagle3`` from a small model run after each step
(``hetero.engine.spec_decode.proposer``); ``verify`` turns the target's logits at the draft rows into
the emitted tokens through the ``rejection_sample`` op.
"""

from hetero.engine.spec_decode.config import SpeculativeConfig

__all__ = ["SpeculativeConfig"]
