"""Using a trained checkpoint: load it safely, open its hint index, generate (with a KV cache and
optional n-gram drafting verified by the model), and score passages with and without hints.

Every position's hints come from train/evaluate.py's `val_hint_arrays`, the function validation
uses, over the whole sequence so far: a generated position gets exactly the hints validation
would give it. Drafted runs are verified in one forward over [pending token, drafts...]: at
temperature 0 a draft is accepted while it equals the model's argmax; otherwise a token is
sampled from the model's distribution at each position in turn and compared with the draft
(one draw per emitted token, in order, so the seeded output does not depend on drafting).
Bad input ends in one `InferenceError` line naming the argument and what was expected.
"""
import dataclasses
import resource
import time

import numpy as np
import torch
import torch.nn.functional as F

from model.gpt import GPT, GPTConfig
from model.kv_cache import KVCache, forward_cached
from train.checkpoint import CheckpointError, _load_torch
from train.evaluate import val_hint_arrays


class InferenceError(ValueError):
    """Bad input to generation or scoring: the message is one line for the user."""


def load_model(path, device="cpu"):
    """(model in eval mode, the n-gram lengths it was trained with) from a checkpoint written by
    train_gpt.py --save-checkpoint, loaded with torch.load(weights_only=True)."""
    try:
        state = _load_torch(path)
    except CheckpointError as e:
        raise InferenceError(f"--checkpoint {e}") from None
    if not isinstance(state, dict) or "model_config" not in state or "model" not in state:
        raise InferenceError(f"--checkpoint {path}: not a checkpoint of train_gpt.py (no model_config / model)")
    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    cfg = GPTConfig(**{k: v for k, v in state["model_config"].items() if k in fields})
    model = GPT(cfg)
    model.load_state_dict(state["model"])
    settings = state.get("settings") or {}
    lengths = tuple(settings.get("hint_lengths") or (state.get("args") or {}).get("hint_lengths") or ())
    return model.to(device).eval(), lengths


def open_index(index_path, hint_files, lengths, workers=2):
    """(index, load or build seconds): a saved index mapped read-only, or one built from shards.
    Refused unless its n-gram lengths are the checkpoint's."""
    from hints import Geometry, HintIndex
    from hints.tokens import read_all
    t0 = time.perf_counter()
    if index_path:
        try:
            idx = HintIndex.load(index_path, mmap=True, workers=workers)
        except (ValueError, OSError) as e:
            raise InferenceError(f"--index {index_path}: {e}") from None
        what = f"--index {index_path}"
    else:
        toks = read_all(hint_files)
        idx = HintIndex(Geometry.for_tokens(toks.size, lengths=lengths), workers=workers).add(toks).seal()
        what = f"--hint-files {hint_files}"
    if tuple(idx.geom.lengths) != tuple(lengths):
        raise InferenceError(f"{what}: built with n-gram lengths {tuple(idx.geom.lengths)}, the checkpoint's model "
                             f"takes hints of lengths {tuple(lengths)}")
    return idx, time.perf_counter() - t0


def check_prompt(ids, vocab_size, context):
    """The prompt as an int64 array, or an InferenceError: empty, too long, an id out of range."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size == 0:
        raise InferenceError("--prompt: empty; give at least one token")
    if ids.size >= context:
        raise InferenceError(f"--prompt: {ids.size} tokens, the model's context is {context} (the prompt must leave "
                             f"room for one new token)")
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.size:
        raise InferenceError(f"--prompt: token id {int(bad[0])} is out of range for the model's vocabulary of "
                             f"{vocab_size} ids")
    return ids


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Generator:
    """Generation from one model, with hints from `index` (None: the backbone alone)."""

    def __init__(self, model, index=None):
        self.model, self.index = model, index
        self.vocab = model.cfg.vocab_size
        self.device = next(model.parameters()).device

    def hints(self, seq, start, stop):
        """The model's hint tensors for positions [start, stop) of seq (1-D int64), or None."""
        if self.index is None:
            return None
        arrays = val_hint_arrays(self.index, seq.astype(np.uint16), start, stop)
        top = max(int(a.max()) for a in arrays[:1]) if arrays[0].size else -1
        if top >= self.vocab:
            raise InferenceError(f"--index: hints token id {top}, outside the model's vocabulary of {self.vocab} ids "
                                 f"(the index was built on another vocabulary)")
        return tuple(torch.from_numpy(a).unsqueeze(0).to(self.device) for a in arrays)

    def pick(self, logits, temperature, top_k, gen):
        """The next token from (vocab,) logits: argmax at temperature 0, else one draw."""
        if temperature <= 0:
            return int(torch.argmax(logits))
        logits = logits.float() / temperature
        if top_k:
            kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        return int(torch.multinomial(F.softmax(logits, dim=-1), 1, generator=gen))

    @torch.no_grad()
    def generate(self, prompt, max_new_tokens, *, temperature=0.0, top_k=0, seed=0, drafter=None, n_draft=16):
        """New tokens after prompt, and the run's figures. drafter: an object whose draft(seq, n)
        returns up to n token ids to follow seq (hints.draft.LlamaDrafter, hints.draft.HintDrafter)."""
        ctx = self.model.cfg.max_seq_len
        prompt = check_prompt(prompt, self.vocab, ctx)
        max_new = min(int(max_new_tokens), ctx - prompt.size)
        gen = torch.Generator().manual_seed(seed)
        if drafter is not None:
            drafter.reset()
        seq = np.zeros(ctx + n_draft + 1, dtype=np.int64)
        seq[:prompt.size] = prompt
        n = prompt.size
        cache = KVCache(self.model)
        t = dict(forward_s=0.0, hint_s=0.0, draft_s=0.0)
        n_forwards = n_drafted = n_accept = 0
        t_start = time.perf_counter()

        def forward(lo, hi):
            t0 = time.perf_counter()
            h = self.hints(seq[:hi], lo, hi)
            t1 = time.perf_counter()
            x = torch.from_numpy(seq[lo:hi]).unsqueeze(0).to(self.device)
            logits = forward_cached(self.model, x, h, cache)[0]
            t["hint_s"] += t1 - t0
            t["forward_s"] += time.perf_counter() - t1
            return logits

        if n > 1:  # prefill: every prompt token but the last, which is fed with the first drafts
            forward(0, n - 1)
            n_forwards += 1
        produced = 0
        while produced < max_new:
            room = min(n_draft, max_new - produced - 1, ctx - n)
            drafts = np.zeros(0, np.int64)
            if drafter is not None and room > 0:
                t0 = time.perf_counter()
                drafts = np.asarray(drafter.draft(seq[:n], room), dtype=np.int64)[:room]
                t["draft_s"] += time.perf_counter() - t0
                if drafts.size and (drafts.min() < 0 or drafts.max() >= self.vocab):
                    raise InferenceError(f"--draft: drafted token id {int(drafts.max())} is outside the model's "
                                         f"vocabulary of {self.vocab} ids")
            k = drafts.size
            seq[n:n + k] = drafts
            logits = forward(n - 1, n + k)  # the pending token and the drafts: k + 1 distributions
            n_forwards += 1
            n_drafted += k
            accepted = 0
            while True:
                y = self.pick(logits[accepted], temperature, top_k, gen)
                if accepted < k and y == drafts[accepted]:
                    accepted += 1
                    continue
                break
            n_accept += accepted
            seq[n + accepted] = y  # the first token the drafts did not give (or the one after them all)
            cache.truncate(n + accepted)  # keep the pending token and the accepted drafts
            n += accepted + 1
            produced += accepted + 1
        n_out = min(produced, max_new)
        total = time.perf_counter() - t_start
        tokens = seq[prompt.size:prompt.size + n_out].tolist()
        return dict(tokens=tokens, n_new=n_out, n_forwards=n_forwards, n_drafted=n_drafted, n_accept=n_accept,
                    accept_pct=100 * n_accept / max(n_drafted, 1), seconds=total,
                    tokens_per_s=n_out / total if total > 0 else 0.0,
                    draft_ms_per_token=1e3 * t["draft_s"] / max(n_drafted, 1), draft_s=t["draft_s"],
                    forward_s=t["forward_s"], hint_s=t["hint_s"], capped_at_context=max_new < max_new_tokens)


@torch.no_grad()
def passage_losses(model, index, tokens):
    """(loss with hints, loss without) of one passage (1-D ids): mean cross-entropy of tokens[1:]
    given the tokens before, hints from val_hint_arrays over the passage alone."""
    ctx = model.cfg.max_seq_len
    tokens = np.asarray(tokens, dtype=np.int64)[:ctx + 1]
    if tokens.size < 2:
        raise InferenceError(f"passage of {tokens.size} token(s): need at least 2")
    x = torch.from_numpy(tokens[:-1]).unsqueeze(0)
    y = torch.from_numpy(tokens[1:]).unsqueeze(0)
    device = next(model.parameters()).device
    x, y = x.to(device), y.to(device)
    without = float(_loss(model, x, y, None))
    if index is None:
        return None, without
    arrays = val_hint_arrays(index, tokens.astype(np.uint16), 0, tokens.size - 1)
    hints = tuple(torch.from_numpy(a).unsqueeze(0).to(device) for a in arrays)
    return float(_loss(model, x, y, hints)), without


def _loss(model, x, y, hints):
    """GPT.forward's loss on any length: the model's windowed attention needs whole blocks, so
    the logits come from the KV-cache forward, which takes any length."""
    cache = KVCache(model)
    logits = forward_cached(model, x, hints, cache)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))
