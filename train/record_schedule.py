"""The record's recipe by step: its five stages and every per-step value the record preset reads
(windows, cut lengths, segments, MTP and prefix weights, sampled-softmax candidates, the LR
multiplier, the ANVIL rails, the table's cadence, the tie), the switches, and --describe's view.

At 570 steps every value is the record's (its config.py, schedule.py, training.py,
sampled_softmax.py, ngram_table.py, tail_average.py; RECORD.md section 10):
  stages     fractions (0.2854, 0.3209, 0.3931) normalised, TAPER 0.06 cut off the last, of the
             560 scheduled steps: ends 160, 340, 526, 560; then 10 extension steps (570)
  per stage  windows (short, long) in 128-token blocks 1/3, 3/7, 5/11, 5/11, 6/13; cut lengths
             896 / 2048 / 3072 / 3072 / 3072 tokens, attention segments split every 2560 tokens
             (so from 340); MTP weights ramped linearly within a stage; the prefix weight stepped
             through equal parts of a stage; candidates P 10240 (stages 0, 1), 14336 / 14336 / 24576
             in thirds of stage 2, the full softmax after
  s          1 before 280 (half the scheduled steps), linear to 0.30 at 560, 0.30 after
  rails      beta 0.85 -> 0.93 over steps 0-116, flat, back towards 0.85 over the last 24; the
             blend of both rails from 245
  table      events on odd steps before 160, then on steps = 3 mod 4
  tie        the Adam updates through the first odd step of the extension (561) are tied
  tails      tail-ema / bank-blend windows from 570 - 142, tail-avg / value-embed-avg from 570 - 119
  final val  windows 6/20 (no YaRN for 13 -> 20)

This repo's rule: with `steps` = N, EVERY step constant scales by N/570, rounded half up: the
scheduled/extension split, the absolute ones (116, 245, 160, 16 exact fp8 refreshes) and those
counted back from the end (24, 142, 119) alike, so a short run passes every stage and switch in
miniature. The record itself moves only the stage-tied and end-relative ones with its step count
(docs/design.md). Cadences (period 2 / 4), window sizes in blocks and candidate counts do not scale.
The extension keeps at least 4 steps (the untie, an odd step, and an untied Adam step after it);
from MIN_STEPS on, every switch falls in the record's order. Token lengths are whole blocks
(block_tokens, 128 at the record), so a demo with short documents scales them with one number.
"""
import math
from dataclasses import asdict, dataclass

from model.fp8 import MLP_EXACT_SCALE_REFRESHES

RECORD_STEPS = 570                 # config.py: 560 scheduled + 10 extension
RECORD_EXTENSION = 10
STAGE_DURATIONS = (0.2854, 0.3209, 0.3931)   # config.py, normalised to sum 1
TAPER_DURATION = 0.06              # config.py: the terminal stage, cut off the last duration
LR_COOLDOWN_FRAC, LR_FLOOR = 0.5, 0.30       # config.py, schedule.py
BLOCK_TOKENS = 128                 # config.py BLOCK_SIZE: windows and lengths are whole blocks
SEGMENT_BLOCKS = 20                # config.py VIRTUAL_SEQ_CAP 2560 = 20 blocks
FINAL_LONG_BLOCKS = 20             # config.py WS_POST_YARN_EXT: the final validation's long window
RAIL_BETA_MIN, RAIL_BETA_MAX = 0.85, 0.93    # schedule.py get_rail_beta
RAIL_WARMUP_STEPS, RAIL_COOLDOWN_STEPS = 116, 24
RAIL_ENGAGE_STEP = 245             # optim/anvil.py
TABLE_PERIOD4_START = 160          # ngram_table.py NGRAM_ADAM_PERIOD4_START
TAIL_EMA_WINDOW, TAIL_AVG_WINDOW = 142, 119  # tail_average.py (also the bank-blend / value-embed-avg windows)
TAIL_AVG_RATE_STEPS = 4.0 / 53.0 * 1194      # tail_average.py TAIL_AVG_RATE = this / 570
TOKENS_PER_STEP = 8 * 2048 * 8     # config.py batch_size: 131,072 tokens a step, every stage
FULL_VOCAB = 50304                 # the record's padded vocabulary
WARMUP_AROUND = (-2, -1, 0, 1)     # train_gpt.py compile_steps: the warm-up's steps around each transition ...
WARMUP_AFTER_UNTIE = (1, 2, 3)     # ... and after the untie (a new optimizer path for embed)

# The five stages (config.py TRAINING_STAGES; sampled_softmax.py CANDIDATES_BY_STAGE).
STAGE_TABLE = [
    # (short, long) window blocks, cut blocks, MTP start, MTP end, prefix weights, candidates
    ((1, 3), 7, (1.0, 0.5, 0.25), (1.0, 0.5, 0.0), (0.25,), (10240,)),
    ((3, 7), 16, (1.0, 0.5), (1.0, 0.0), (0.20, 0.15, 0.10, 0.05), (10240,)),
    ((5, 11), 24, (1.0,), (1.0,), (0.0,), (14336, 14336, 24576)),
    ((5, 11), 24, (1.0,), (1.0,), (0.0,), ()),
    ((6, 13), 24, (1.0,), (1.0,), (0.0,), ()),
]
MIN_STEPS = 84  # from here every stage and switch happens in the record's order (tests/test_record_schedule.py)


def round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


@dataclass(frozen=True)
class Stage:
    index: int
    first_step: int
    end_step: int                 # exclusive
    window_blocks: tuple[int, int]
    cut_tokens: int
    mtp_start: tuple[float, ...]
    mtp_end: tuple[float, ...]
    prefix_weights: tuple[float, ...]
    candidates: tuple[int, ...]   # equal parts of the stage; () = the full softmax


@dataclass(frozen=True)
class StepPlan:
    """Everything the record preset reads for one training step (StepSettings is filled from it)."""
    step: int
    stage: int
    window_blocks: tuple[int, int]    # (short, long)
    window_tokens: tuple[int, int]
    cut_tokens: int                   # documents are cut to this many tokens
    max_seq_len: int                  # attention segments: min(cut, 2560 at the record)
    mtp_weights: tuple[float, ...]
    prefix_weight: float
    candidates: int | None            # sampled-softmax P; None = the full softmax
    lr_scale: float                   # s
    rail_beta: float                  # beta(t): ANVIL's Nesterov lookahead (and fast rail before engaging)
    rails_engaged: bool
    adam_step: bool                   # odd: the dense Adam updates (model/record_adam.py)
    table_event: bool                 # the n-gram table and value_embeds update
    tied: bool                        # this step's Adam update is a tied one (<= untie step)
    eval: bool = False
    canonical_mask: bool = False


class RecordSchedule:
    def __init__(self, steps: int = RECORD_STEPS, *, block_tokens: int = BLOCK_TOKENS,
                 tokens_per_step: int = TOKENS_PER_STEP, vocab: int = FULL_VOCAB):
        if steps < MIN_STEPS:
            raise ValueError(f"RecordSchedule: steps={steps} is below {MIN_STEPS}, where every stage and switch "
                             "of the record still happens")
        self.steps, self.block_tokens, self.tokens_per_step, self.vocab = steps, block_tokens, tokens_per_step, vocab
        # >= 4: the extension holds the untie (an odd step) and an untied Adam step after it
        self.extension = max(4, self.scaled(RECORD_EXTENSION))
        self.scheduled = steps - self.extension
        fractions = [d / sum(STAGE_DURATIONS) for d in STAGE_DURATIONS]
        fractions = [fractions[0], fractions[1], fractions[2] - TAPER_DURATION, TAPER_DURATION]
        ends = [0] + [round_half_up(sum(fractions[:i + 1]) * self.scheduled) for i in range(4)] + [steps]
        self.stages = [Stage(i, ends[i], ends[i + 1], row[0], row[1] * block_tokens, *row[2:])
                       for i, row in enumerate(STAGE_TABLE)]
        self.cooldown_start = int(self.scheduled * (1 - LR_COOLDOWN_FRAC))
        self.untie_step = self.scheduled | 1          # schedule.py split_step: extension start | 1
        self.rail_warmup = self.scaled(RAIL_WARMUP_STEPS)
        self.rail_cooldown = self.scaled(RAIL_COOLDOWN_STEPS)
        self.engage_step = self.scaled(RAIL_ENGAGE_STEP)
        self.table_switch = self.scaled(TABLE_PERIOD4_START)
        self.fp8_exact_refreshes = self.scaled(MLP_EXACT_SCALE_REFRESHES)
        self.tail_ema_window = self.scaled(TAIL_EMA_WINDOW)
        self.tail_avg_window = self.scaled(TAIL_AVG_WINDOW)
        self.tail_avg_rate = min(1.0, TAIL_AVG_RATE_STEPS / steps)
        # tail_average.py: the value-embed average assumes the period-4 cadence over its whole window
        assert steps - self.tail_avg_window >= self.table_switch

    def scaled(self, record_steps: int) -> int:
        """A step constant of the record's 570-step run at this run's length (at least 1)."""
        return max(1, round_half_up(record_steps * self.steps / RECORD_STEPS))

    # ---- per-step values ----

    def stage_at(self, step: int) -> Stage:
        for stage in self.stages:
            if step < stage.end_step:
                return stage
        return self.stages[-1]

    def _progress(self, step: int, stage: Stage) -> float:
        return min(1.0, (step - stage.first_step) / (stage.end_step - stage.first_step))

    def mtp_weights(self, step: int) -> tuple[float, ...]:
        stage = self.stage_at(step)
        t = self._progress(step, stage)
        return tuple(a + (b - a) * t for a, b in zip(stage.mtp_start, stage.mtp_end))

    def prefix_weight(self, step: int) -> float:
        stage = self.stage_at(step)
        n = len(stage.prefix_weights)
        return stage.prefix_weights[min(n - 1, int(self._progress(step, stage) * n))]

    def candidates(self, step: int) -> int | None:
        """Sampled-softmax P (sampled_softmax.py candidate_count_at); None: the full softmax (also when
        P would not be below the vocabulary)."""
        stage = self.stage_at(step)
        if not stage.candidates:
            return None
        n = len(stage.candidates)
        p = stage.candidates[min(n - 1, (step - stage.first_step) * n // (stage.end_step - stage.first_step))]
        return p if p < self.vocab else None

    def lr_scale(self, step: int) -> float:
        if step < self.cooldown_start:
            return 1.0
        t = min(1.0, (step - self.cooldown_start) / (self.scheduled - self.cooldown_start))
        return (1 - t) + LR_FLOOR * t

    def rail_beta(self, step: int) -> float:
        cooldown_start = self.steps - self.rail_cooldown
        if step < self.rail_warmup:
            return RAIL_BETA_MIN + step / self.rail_warmup * (RAIL_BETA_MAX - RAIL_BETA_MIN)
        if step > cooldown_start:
            return RAIL_BETA_MAX - (step - cooldown_start) / self.rail_cooldown * (RAIL_BETA_MAX - RAIL_BETA_MIN)
        return RAIL_BETA_MAX

    def is_table_event(self, step: int) -> bool:
        """ngram_table.py is_update_step: odd steps, then steps = 3 mod 4 from the switch."""
        return step % 4 == 3 if step >= self.table_switch else step % 2 == 1

    def plan(self, step: int) -> StepPlan:
        if not 0 <= step < self.steps:
            raise ValueError(f"RecordSchedule.plan: step {step} outside the run's 0..{self.steps - 1}")
        stage = self.stage_at(step)
        short, long = stage.window_blocks
        return StepPlan(step=step, stage=stage.index, window_blocks=(short, long),
                        window_tokens=(short * self.block_tokens, long * self.block_tokens),
                        cut_tokens=stage.cut_tokens, max_seq_len=min(stage.cut_tokens, self.segment_tokens),
                        mtp_weights=self.mtp_weights(step), prefix_weight=self.prefix_weight(step),
                        candidates=self.candidates(step), lr_scale=self.lr_scale(step),
                        rail_beta=self.rail_beta(step), rails_engaged=step >= self.engage_step,
                        adam_step=step % 2 == 1, table_event=self.is_table_event(step),
                        tied=step <= self.untie_step)

    def final_validation(self) -> StepPlan:
        """The final validation's settings: the last stage's short window, the long one at 20 blocks
        (no YaRN rescale for it), the full softmax, the canonical mask."""
        last = self.plan(self.steps - 1)
        short = last.window_blocks[0]
        return StepPlan(**{**asdict(last), "step": self.steps, "window_blocks": (short, FINAL_LONG_BLOCKS),
                           "window_tokens": (short * self.block_tokens, FINAL_LONG_BLOCKS * self.block_tokens),
                           "mtp_weights": (1.0,), "prefix_weight": 0.0, "candidates": None,
                           "eval": True, "canonical_mask": True})

    @property
    def segment_tokens(self) -> int:
        return SEGMENT_BLOCKS * self.block_tokens

    # ---- the switches and --describe ----

    def switches(self) -> dict[str, int]:
        """Every named switch's first step, in step order."""
        p_changes = [s for s in range(1, self.steps) if self.candidates(s) != self.candidates(s - 1)]
        out = {"rail_warmup_end": self.rail_warmup, "table_period4": self.table_switch,
               "rail_engage": self.engage_step, "lr_cooldown_start": self.cooldown_start,
               **{f"stage_{st.index}": st.first_step for st in self.stages[1:]},
               **{f"candidates_{self.candidates(s) or 'full'}": s for s in p_changes},
               "tail_ema_start": self.steps - self.tail_ema_window, "tail_avg_start": self.steps - self.tail_avg_window,
               "rail_cooldown_start": self.steps - self.rail_cooldown, "untie_after": self.untie_step,
               "end": self.steps}
        return dict(sorted(out.items(), key=lambda kv: kv[1]))

    def window_schedule(self) -> list[list[int]]:
        """[first_step, short_blocks, long_blocks] at each change of the training windows."""
        out = []
        for st in self.stages:
            if not out or out[-1][1:] != list(st.window_blocks):
                out.append([st.first_step, *st.window_blocks])
        return out

    def warmup_steps(self) -> list[int]:
        """The untimed warm-up's steps, ascending (the record's train_gpt.py compile_steps): 0 and 1, the
        two steps either side of every stage start and every change of the candidate count (from step
        2), and the three steps after the untie, so that every training configuration (each stage's
        windows and cut, each sampled-softmax size, tied and untied Adam steps, even and odd steps)
        runs once before the clock. At 570 steps: 0, 1, 158-161, 338-341, 462-465, 524-527, 558-564."""
        transitions = {st.first_step for st in self.stages[1:]}
        transitions |= {s for s in range(1, self.steps) if self.candidates(s) != self.candidates(s - 1)}
        steps = {0, 1} | {s + o for s in transitions for o in WARMUP_AROUND if 2 <= s + o < self.steps}
        steps |= {self.untie_step + o for o in WARMUP_AFTER_UNTIE if self.untie_step + o < self.steps}
        return sorted(steps)

    def tail_settings(self) -> dict:
        """The tail averages' step constants (model/tail_average.py TailAverages' keyword arguments)."""
        return dict(total_steps=self.steps, ema_window=self.tail_ema_window, avg_window=self.tail_avg_window,
                    avg_rate=self.tail_avg_rate)

    def describe(self) -> dict:
        final = self.final_validation()
        return {
            "steps": self.steps, "scheduled_steps": self.scheduled, "extension_steps": self.extension,
            "tokens_per_step": self.tokens_per_step, "block_tokens": self.block_tokens,
            "stages": [dict(first_step=st.first_step, last_step=st.end_step - 1, window_blocks=list(st.window_blocks),
                            cut_tokens=st.cut_tokens, segment_tokens=min(st.cut_tokens, self.segment_tokens),
                            mtp_weights_start=list(st.mtp_start), mtp_weights_end=list(st.mtp_end),
                            prefix_weights=list(st.prefix_weights),
                            candidates=[p if p < self.vocab else None for p in st.candidates] or None)
                       for st in self.stages],
            "switches": self.switches(),
            "fp8_exact_refreshes": self.fp8_exact_refreshes,
            "window_schedule": self.window_schedule(),
            "warmup_steps": self.warmup_steps(),
            "final_validation": {"window_blocks": list(final.window_blocks), "yarn_rescale": False},
            "tail": self.tail_settings(),
        }
