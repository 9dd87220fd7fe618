"""Step timing and hint-work accounting: the training clock, the interval log line, the totals.

The clock runs only while steps run: it stops (after a device sync) for validation and
checkpoints, as the speedrun's clock does. It reads time.monotonic() (CLOCK_MONOTONIC), the clock the
background builder reports its times on. Its first start releases the background index
builder (`on_clock_start`): building the hint corpus is training-side work, on the clock. Every step records its loss, how long the loop waited
for its prepared batch, and how long the prep thread spent looking up and adding hints.
`interval_line()` averages the steps since the last line; `totals()` is what the summary and a
checkpoint keep.
"""
import time

import torch

from data.units import human_tokens

# Dense bf16 tensor-core peak of one H100 SXM (NVIDIA datasheet: 989.4 TFLOPS without
# sparsity); the H200 is the same GH100 chip with more memory, so the same peak. MFU is
# measured against it on every CUDA GPU.
H100_BF16_DENSE_PEAK_FLOPS = 989e12
TOTAL_KEYS = ("train_s", "wait_s", "lookup_s", "add_s", "load_s", "steps_timed")


class Meter:
    def __init__(self, d, global_batch, flops_per_token, saved=None, target_val_loss=None):
        self.d, self.global_batch, self.flops_per_token = d, global_batch, flops_per_token
        self.target_val_loss = target_val_loss
        self.target = None  # (step, train seconds) of the first validation at or below the target
        self.switched_at = None  # the step after which training-time hints came from the background index
        saved = saved or {}
        self.total = {k: saved.get(k, 0) for k in TOTAL_KEYS}
        self.train_losses = list(saved.get("train_losses", []))  # [step, mean loss over ranks]
        self.val_history = list(saved.get("val_history", []))
        self.last_val = {}
        self.started = None  # time.monotonic() of the clock's latest start while it runs, else None
        self.stopped_at = None  # time.monotonic() of its latest stop
        self.clock_start = None  # time.monotonic() when the clock first started (one clock for every process)
        self.on_clock_start = []  # called once with it: the background builder's go (hints/index/background.py)
        self._new_interval()

    # -- the clock ----------------------------------------------------------------------------
    def start(self):
        self.d.sync()
        self.started = time.monotonic()
        if self.clock_start is None:
            self.clock_start = self.started
            for hook in self.on_clock_start:
                hook(self.clock_start)
        self.interval_t0 = self.train_time()

    def stop(self):
        self.d.sync()
        if self.started is not None:
            self.stopped_at = time.monotonic()
            self.total["train_s"] += self.stopped_at - self.started
            self.started = None

    def train_time(self):
        return self.total["train_s"] + (time.monotonic() - self.started if self.started is not None else 0.0)

    # -- per step -------------------------------------------------------------------------------
    def record(self, loss, waited, item):
        """One trained step: its loss (a device tensor, read at the next log line), the seconds
        the loop waited for `item`, and the prep thread's timings in it."""
        self.losses.append(loss)
        self.wait += waited
        self.prep += item.lookup_s + item.add_s
        for key, value in (("wait_s", waited), ("lookup_s", item.lookup_s), ("add_s", item.add_s),
                           ("load_s", item.load_s), ("steps_timed", 1)):
            self.total[key] += value

    def _new_interval(self):
        self.losses, self.wait, self.prep = [], 0.0, 0.0
        self.interval_t0 = self.train_time() if self.started is not None else 0.0

    def mfu(self, tokens_per_s):
        if not self.d.cuda:
            return None
        return self.flops_per_token * tokens_per_s / (H100_BF16_DENSE_PEAK_FLOPS * self.d.world_size)

    def interval_line(self, step, total_steps):
        """(log line, wandb metrics) for the steps since the last line; losses averaged over ranks."""
        losses = self.d.all_mean(torch.stack(self.losses).float()).tolist()
        first = step - len(losses) + 1
        self.train_losses.extend([first + i, v] for i, v in enumerate(losses))
        n = len(losses)
        now = self.train_time()
        step_s = (now - self.interval_t0) / n
        tok_s = self.global_batch / step_s if step_s > 0 else 0.0
        wait_ms, prep_ms = self.wait / n * 1e3, self.prep / n * 1e3
        parts = [f"step {step}/{total_steps} loss {sum(losses) / n:.4f}", f"{step_s * 1e3:.1f}ms/step {tok_s:,.0f} tok/s"]
        mfu = self.mfu(tok_s)
        if mfu is not None:
            parts.append(f"MFU {mfu:.1%}")
        parts.append(f"hint wait {wait_ms:.2f}ms, CPU prep {prep_ms:.1f}ms "
                     f"({prep_ms / max(step_s * 1e3, 1e-9):.1%} of step, in its thread)")
        parts.append(f"train {now:.1f}s")
        metrics = {"train/loss": losses[-1], "train/step_ms": step_s * 1e3, "train/tokens_per_s": tok_s,
                   "hints/wait_ms": wait_ms, "hints/prep_ms": prep_ms}
        self._new_interval()
        return " | ".join(parts), metrics

    def record_val(self, step, res, log):
        """A validation's result (train.evaluate.validate's dict): kept for the history and the
        summary. A wait for the background index is training time. True when this validation
        reaches --target-val-loss with hints (the same on every rank: losses are all-reduced)."""
        self.last_val = res
        self.total["train_s"] += res.get("bg_wait_s", 0.0)
        self.val_history.append(dict(step=step, loss_hints=res["loss_hints"], loss_nohints=res["loss_nohints"],
                                     index=res["index"], index_tokens=res["index_tokens"], train_s=self.total["train_s"]))
        if self.target_val_loss is not None and res["loss_hints"] is not None and res["loss_hints"] <= self.target_val_loss:
            self.target = (step, self.total["train_s"])
            log(f"target reached: val_loss_hints {res['loss_hints']:.4f} <= {self.target_val_loss} at step {step}, "
                f"{human_tokens(step * self.global_batch)} tokens, training time {self.total['train_s']:.2f}s "
                f"(validation excluded)")
            return True
        return False

    # -- totals ---------------------------------------------------------------------------------
    def snapshot(self):
        """What a checkpoint keeps to continue the totals and histories."""
        return dict(self.total, train_losses=self.train_losses, val_history=self.val_history)

    def summary(self):
        """Totals per timed step: the summary JSON's timing fields."""
        t = self.total
        n = max(t["steps_timed"], 1)
        tok_s = n * self.global_batch / t["train_s"] if t["train_s"] > 0 else 0.0
        step_ms = max(t["train_s"] / n * 1e3, 1e-9)
        prep_ms = (t["lookup_s"] + t["add_s"]) / n * 1e3
        wait_ms = t["wait_s"] / n * 1e3
        return dict(
            train_time_s=t["train_s"], steps_timed=t["steps_timed"], step_ms=step_ms, tokens_per_s=tok_s,
            mfu=self.mfu(tok_s), hint_prep_ms_per_step=prep_ms, hint_lookup_ms_total=t["lookup_s"] * 1e3,
            hint_add_ms_total=t["add_s"] * 1e3, hint_prep_share=prep_ms / step_ms,
            hint_wait_ms_total=t["wait_s"] * 1e3, hint_wait_ms_per_step=wait_ms, hint_wait_share=wait_ms / step_ms,
            data_load_ms_total=t["load_s"] * 1e3, train_losses=self.train_losses, val_history=self.val_history)

    def finish(self, log, steps, digests, **facts):
        """Log the run's final lines; the summary dict: the run's facts, the last validation, the
        timing totals and whether every rank ends with the same weights (`digests`, one per rank)."""
        v = self.last_val
        fmt = lambda x: f"{x:.4f}" if x is not None else "n/a"  # noqa: E731
        log(f"final: val_loss_hints {fmt(v.get('loss_hints'))} val_loss_nohints {fmt(v.get('loss_nohints'))} "
            f"(hints: {v.get('index_desc', 'n/a')})")
        for line in self.summary_lines(steps):
            log(line)
        if len(set(digests)) != 1:
            log(f"WARNING: ranks hold different weights: {digests}")
        if self.target_val_loss is not None and self.target is None:
            best = min((h["loss_hints"] for h in self.val_history if h["loss_hints"] is not None), default=None)
            log(f"target NOT reached: no validation reached val_loss_hints <= {self.target_val_loss} in {steps} steps "
                f"(best {fmt(best)}); no time to target")
        target_step, target_s = self.target or (None, None)
        return dict(facts, steps=steps, target_val_loss=self.target_val_loss, target_reached=self.target is not None,
                    time_to_target_s=target_s, steps_to_target=target_step,
                    tokens_to_target=target_step * self.global_batch if target_step else None, train_tokens=steps * self.global_batch, global_batch_tokens=self.global_batch,
                    val_loss_hints=v.get("loss_hints"), val_loss_nohints=v.get("loss_nohints"),
                    val_tokens=v.get("tokens"), val_index=v.get("index"), val_index_reason=v.get("index_reason"),
                    hint_tokens_val=v.get("index_tokens", 0), **self.summary(), param_digests=digests,
                    ranks_in_sync=len(set(digests)) == 1,
                    peak_memory_gib=torch.cuda.max_memory_allocated(self.d.device) / 2**30 if self.d.cuda else None)

    def summary_lines(self, steps):
        s = self.summary()
        mfu = f", MFU {s['mfu']:.1%}" if s["mfu"] is not None else ""
        mem = (f", peak memory {torch.cuda.max_memory_allocated(self.d.device) / 2**30:.1f} GiB"
               if self.d.cuda else "")
        n = max(s["steps_timed"], 1)
        return [
            f"final: {steps} steps, {human_tokens(steps * self.global_batch)} tokens, train time "
            f"{s['train_time_s']:.1f}s, {s['step_ms']:.1f}ms/step, {s['tokens_per_s']:,.0f} tok/s{mfu}{mem}",
            f"final: hints: CPU prep {s['hint_prep_ms_per_step']:.2f}ms/step in the prep thread (lookup "
            f"{self.total['lookup_s'] / n * 1e3:.2f} + add {self.total['add_s'] / n * 1e3:.2f}) = "
            f"{s['hint_prep_share']:.1%} of step time; the loop waited {s['hint_wait_ms_per_step']:.3f}ms/step "
            f"({s['hint_wait_share']:.2%}), {s['hint_wait_ms_total']:.1f}ms in all",
        ]
