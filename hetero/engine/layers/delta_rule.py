"""The recurrent core shared by Gated DeltaNet (``layers/gated_deltanet.py``) and Kimi's KDA (``layers/kda.py``):
``causal_conv1d`` with SiLU over the q|k|v channels, then ``gated_delta_rule``, and the two per-sequence states.

Under speculative decoding a step's leading sequences verify drafts: ``Step.token_states`` gives them a
group of slots, and they run through the per-token form of both ops (spec 1.11), which keeps the state
after each row so the engine continues from the last accepted one; the other sequences run as usual.
"""

from __future__ import annotations

import torch

from hetero.engine.context import ModelContext
from hetero.engine.layers.cached import CachedLayer, Shard, StateEntry
from hetero.engine.step import Step
from hetero.ops import takes_option

__all__ = ["DeltaRuleMixer"]


class DeltaRuleMixer(CachedLayer):
    """The recurrent core of a delta-rule token mixer: ``causal_conv1d`` (SiLU) over this rank's q|k|v channels,
    then ``gated_delta_rule``, and the two per-sequence states. A subclass makes the projections and gates and
    calls ``init_recurrent`` from its ``__init__``."""

    per_token_states = True

    def init_recurrent(self, ctx: ModelContext, heads: tuple[int, int, int, int], width: int) -> None:
        """This rank's (key heads, value heads, key dim, value dim) and the conv width; binds the two ops."""
        self.hk, self.hv, self.dk, self.dv = heads
        self.width, self.channels = width, 2 * self.hk * self.dk + self.hv * self.dv
        r, n = ctx.parallel.rank, ctx.parallel.size
        qk, v = self.hk * self.dk, self.hv * self.dv  # this rank's q (and k) and v channels, cut in rank order
        rows = [*range(r * qk, (r + 1) * qk), *range((n + r) * qk, (n + r + 1) * qk)]
        rows += range(2 * n * qk + r * v, 2 * n * qk + (r + 1) * v)
        self.shards = (
            Shard.of(1, n * self.channels, rows),
            Shard.of(0, n * self.hv, range(r * self.hv, (r + 1) * self.hv)),
        )
        # a step plan is passed only to ops that take one (an implementation older than spec 1.6 does not)
        bound = {
            op: ctx.bind_op(self, attr, op)
            for attr, op in (("_conv", "causal_conv1d"), ("_delta_rule", "gated_delta_rule"))
        }
        self._plans = all(takes_option(fn, op, "plan") for op, fn in bound.items())
        # speculative decoding's verify rows: the per-token form, resolved as its own static configuration
        for attr, op in (("_conv_tokens", "causal_conv1d"), ("_delta_rule_tokens", "gated_delta_rule")):
            ctx.bind_op(self, attr, op, num_accepted_tokens=True)
        self.conv_state: torch.Tensor | None = None
        self.ssm_state: torch.Tensor | None = None

    def cache_spec(self) -> tuple[StateEntry, ...]:
        return (
            StateEntry("conv_state", (self.width - 1, self.channels), init="flag", shard=self.shards[0]),
            StateEntry("ssm_state", (self.hv, self.dk, self.dv), torch.float32, init="flag", shard=self.shards[1]),
        )

    def recur(self, mixed: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, step: Step) -> torch.Tensor:
        """out [T, HV, V] of q|k|v ``mixed`` [T, channels]; ``g`` float32 [T, HV] or [T, HV, K], ``beta`` [T, HV]."""
        if self.conv_state is None or step.state_slots is None:
            raise RuntimeError(f"{type(self).__name__}: the state pool is not bound or the step has no state slots")
        ts = step.token_states
        if ts is None:
            planned = {"plan": step.state_plan} if self._plans and step.state_plan is not None else {}
            index = (step.meta.query_start_loc, step.state_slots, step.has_initial_state)
            return self._run(self._conv, self._delta_rule, mixed, g, beta, index, planned)
        # the leading sequences verify drafts: every row's state kept (per-token slots); the rest as usual
        n, t = ts.num_seqs, ts.num_tokens
        qsl, has_initial = step.meta.query_start_loc, step.has_initial_state
        verify = (qsl[: n + 1], ts.slots, has_initial[:n])
        out = [
            self._run(
                self._conv_tokens,
                self._delta_rule_tokens,
                mixed[:t],
                g[:t],
                beta[:t],
                verify,
                {"num_accepted_tokens": ts.num_accepted},
            )
        ]
        if t < mixed.shape[0]:
            rest = (qsl[n:] - t, step.state_slots[n:], has_initial[n:])
            out.append(self._run(self._conv, self._delta_rule, mixed[t:], g[t:], beta[t:], rest, {}))
        return torch.cat(out) if len(out) > 1 else out[0]

    def _run(self, conv, delta_rule, mixed, g, beta, index, extra) -> torch.Tensor:
        tokens = mixed.shape[0]
        mixed = conv(mixed.contiguous(), self.conv1d.weight, None, self.conv_state, *index, activation="silu", **extra)
        q, k, v = mixed.split([self.hk * self.dk, self.hk * self.dk, self.hv * self.dv], dim=-1)
        return delta_rule(
            q.reshape(tokens, self.hk, self.dk),
            k.reshape(tokens, self.hk, self.dk),
            v.reshape(tokens, self.hv, self.dv),
            g,
            beta,
            self.ssm_state,
            *index,
            scale=self.dk**-0.5,
            use_qk_l2norm=True,
            **extra,
        )
