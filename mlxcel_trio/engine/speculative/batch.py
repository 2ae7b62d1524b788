"""The decode batch with a verify step: drafts checked in one target forward.

Theory of operation.  mlx-lm's GenerationBatch keeps, per row, the token it
sampled last (`_next_tokens`, not yet in the KV cache and not yet reported)
and feeds it at the next step.  `SpeculativeBatch` replaces that step
whenever some row has a plan (`plans[uid]`) and a drafter proposes tokens
for it:

1. evaluate the pending tokens y; ask the drafter for up to n_max tokens
   per planned row (`Ask`);
2. feed [y, d1..dk] for every row in one forward over (B, k + 1); rows with
   shorter drafts are padded, plain rows draft nothing;
3. run each row's logits processors and sampler on its positions 0..n_i in
   order, exactly as the plain step would have run them one step at a time;
4. row i keeps the drafts that equal the target's own samples, a_i of them,
   reports [y, d1..d_ai] and holds the sample after them as its next token;
5. the cache drops each row's rejected positions (rollback.py: cut for
   attention layers, sliding windows included; restored and re-fed for
   recurrent ones).

Lossless: every reported token is the target's sample given exactly the
tokens before it, so greedy output is identical with and without drafts,
and a sampled row draws from the target's distribution.  A row sampling
with the chain re-winds its random stream to the draws it used (four per
token, see samplers/batch.Row.uniforms), so a seeded request gives the
same text as without speculation.  Rows whose sampler state evolves per
draw, or that report probabilities or follow a grammar, get no plan (the
scheduler decides) and decode one token per step inside the same batch.

When no row has a plan, or no drafter proposes anything, `next` is the
plain step untouched.
"""

from __future__ import annotations

import attrs
import mlx.core as mx
from mlx_lm.generate import GenerationBatch

from .drafters import Ask, Chain
from .rollback import prepare_verify, roll_back, save


@attrs.define(slots=True)
class Plan:
    """One speculating row: its bounds and its running counts."""

    n_max: int                   # the draft model's cap (--spec-draft-n-max)
    n_min: int = 0
    p_min: float = 0.0
    ctx_limit: int = 1 << 30     # the row's KV may hold at most this many tokens
    row: object = None           # the row's samplers/batch.Row (random stream, history)
    banned: tuple[int, ...] = ()  # tokens the row never draws (ignore_eos's EOG ban)
    draft_n: int = 0             # drafted tokens verified
    accepted: int = 0            # of those, kept
    rounds: int = 0              # verify steps with a draft


class SpeculativeBatch(GenerationBatch):
    drafter: Chain
    plans: dict[int, Plan]

    @classmethod
    def create(cls, model, fallback_sampler, drafter: Chain) -> SpeculativeBatch:
        batch = cls.empty(model, fallback_sampler)
        batch.drafter = drafter
        batch.plans = {}
        return batch

    def next(self):
        if not self.uids or not self.plans:
            return super().next()
        asks, where = self._asks()
        if not asks:
            return super().next()
        drafts = self.drafter.propose(asks)
        if not any(drafts):
            return super().next()
        per_row: list[list[int]] = [[] for _ in self.uids]
        for i, d in zip(where, drafts):
            per_row[i] = d
        return self._verify(per_row)

    def _asks(self) -> tuple[list[Ask], list[int]]:
        """One Ask per planned row that could get a proposal; the pending
        tokens are read (a device sync) only when some row could."""
        asks, where = [], []
        for i, uid in enumerate(self.uids):
            plan = self.plans.get(uid)
            if plan is None:
                continue
            # what fits (upstream's get_n_draft_max): the slot's room, less one
            # cell for a context shift, and the tokens n_predict still allows
            n_left = self.max_tokens[i] - self._num_tokens[i] - 1
            room = plan.ctx_limit - len(self.tokens[i]) - 2
            n_max = min(n_left, room)
            if n_max <= 0 or not self.drafter.may_propose(uid, self.tokens[i]):
                continue
            asks.append(Ask(uid, self.tokens[i], -1, n_max, plan.n_min, plan.p_min,
                            plan.banned, plan.n_max))
            where.append(i)
        if asks:
            mx.eval(self._next_tokens)
            self._ys = self._next_tokens.tolist()
            for a, i in zip(asks, where):
                a.last = self._ys[i]
        return asks, where

    def _verify(self, drafts: list[list[int]]):
        ys = self._ys
        width = max(len(d) for d in drafts)
        rows = [[y, *d, *([y] * (width - len(d)))] for y, d in zip(ys, drafts)]
        inputs = mx.array(rows, dtype=mx.uint32)
        prepare_verify(self.prompt_cache)
        saved = save(self.prompt_cache)  # recurrent layers' state (None without them)
        logits = self.model(inputs, cache=self.prompt_cache)
        sampled, logprobs = self._sample(inputs, logits, drafts)
        reports, nexts = [], []
        finished = []
        for i, uid in enumerate(self.uids):
            d, t = drafts[i], sampled[i]
            a = 0
            while a < len(d) and t[a] == d[a]:
                a += 1
            emit = [ys[i], *d[:a]]
            n_left = self.max_tokens[i] - self._num_tokens[i]
            emit = emit[:max(1, n_left)]
            reason = "length" if self._num_tokens[i] + len(emit) >= self.max_tokens[i] else None
            for j, tok in enumerate(emit):
                if self._matchers[i].advance(tok):
                    emit, reason = emit[:j + 1], "stop"
                    break
            if d:
                plan = self.plans.get(uid)
                kept = min(a, len(emit) - 1)
                if plan is not None:
                    plan.draft_n += len(d)
                    plan.accepted += kept
                    plan.rounds += 1
                self.drafter.accepted(uid, len(d), kept)
            reports.append(emit)
            nexts.append(t[a] if len(emit) == a + 1 else emit[-1])
            if reason is not None:
                finished.append((i, reason))
        roll_back(self.model, self.prompt_cache, saved, width + 1, reports)
        for i, emit in enumerate(reports):
            self.tokens[i].extend(emit)
            if self.logits_processors[i] and len(emit) > 1:
                self._token_context[i].update_and_fetch(mx.array(emit[1:], dtype=mx.int32))
            self._num_tokens[i] += len(emit)
            plan = self.plans.get(self.uids[i])
            if i in self._rng:
                # the plain step would have drawn once per fed token kept
                plan.row.rng_restore(self._rng[i], len(emit))
            if plan is not None and plan.row is not None and plan.row.history:
                del plan.row.history[self._token_context[i]._size:]
        old = self._next_logprobs
        self._next_tokens = mx.array(nexts, dtype=mx.uint32)
        self._next_logprobs = [logprobs[i][min(len(reports[i]) - 1, len(drafts[i]))]
                               for i in range(len(self.uids))]
        done = dict(finished)
        responses = []
        for i, emit in enumerate(reports):
            for j, tok in enumerate(emit):
                last = j == len(emit) - 1
                reason = done.get(i) if last else None
                lp = old[i] if j == 0 and old else logprobs[i][j - 1 if j else 0]
                responses.append(self.Response(
                    uid=self.uids[i], token=tok, logprobs=lp, finish_reason=reason,
                    prompt_cache=self.extract_cache(i) if reason else None,
                    all_tokens=self.tokens[i] if reason else None))
        if done:
            self.filter([i for i in range(len(self.uids)) if i not in done])
        return responses

    def _sample(self, inputs: mx.array, logits: mx.array, drafts: list[list[int]]):
        """Each row's processors and sampler over its positions 0..n_i, in
        row order and position order (the order the shared chain sampler
        pairs its queue with)."""
        blocks, contexts = [], []
        for i in range(len(self.uids)):
            n = len(drafts[i]) + 1
            block = logits[i, :n]
            procs = self.logits_processors[i]
            if procs:
                base = self._token_context[i].update_and_fetch(inputs[i, :1])
                # the buffer now ends with y; drafts are appended once accepted
                done = []
                for j in range(n):
                    ctx = base if j == 0 else mx.concatenate(
                        [base, inputs[i, 1:j + 1].astype(base.dtype)])
                    row = block[j:j + 1]
                    for p in procs:
                        row = p(ctx, row)
                    done.append(row)
                block = mx.concatenate(done, axis=0)
            blocks.append(block)
            contexts.append(n)
        logprobs = [b - mx.logsumexp(b, axis=-1, keepdims=True) for b in blocks]
        samplers = [self.fallback_sampler if s is None else s
                    for s in (self.samplers or [None] * len(self.uids))]
        self._rng = {}
        for i, uid in enumerate(self.uids):
            plan = self.plans.get(uid)
            if plan is not None and plan.row is not None and plan.row.draws and drafts[i]:
                self._rng[i] = plan.row.rng_state()
        groups: dict[int, list[int]] = {}
        for i, s in enumerate(samplers):
            groups.setdefault(id(s), []).append(i)
        tokens: list[mx.array | None] = [None] * len(self.uids)
        for idx in groups.values():
            s = samplers[idx[0]]
            out = s(mx.concatenate([logprobs[i] for i in idx], axis=0))
            at = 0
            for i in idx:
                tokens[i] = out[at:at + contexts[i]]
                at += contexts[i]
        mx.eval(tokens)
        return [t.tolist() for t in tokens], logprobs
