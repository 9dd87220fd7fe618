"""The record's tail averages: the run ships a blend of late-training weight averages, not its
last iterate (the record's tail_average.py; RECORD.md section 12).

Four float32 accumulators, each over the shard of its weights this rank updates in the optimizer
(the flat segment `rank` of `world_size`: ANVIL's units, lm_head's / embed's / value_embeds' rows).
A tick is A <- A + rho (W - A) after that step's update; an accumulator's first tick copies W.
With T the run's steps and E, V its two windows (the record: 570, 142, 119):
  tail-ema         lm_head, embed     from T-E (an even step seeds; the record: 428), every odd step at
                                      1 - (1 - r)^2 (two per-step EMA updates in one), the last at r;
                                      r = 2/(E+1)                                  ship 0.35 W + 0.65 A
  tail-avg         vo_bank, mlp_bank  from T-V where (T-1-s) = 0 mod 4, at avg_rate   ship A
  value-embed-avg  value_embeds       from T-V at its update events, at avg_rate       ship A
  bank-blend       qk, vo, mlp banks  from T-E where s = 1 mod 4, and at T-2, T-1, at 2/(E//4 + 1)
                                      ship qk: 0.45 W + 0.55 A; vo, mlp: lerp(W, A, 0.55 - 0.2007)
The ship runs in that order (so on vo / mlp bank-blend lerps from the shipped tail average; 0.2007
is the record's Richardson correction of a lagging EMA), all-gathers every shipped weight, then
rescales embed, lm_head and the three banks to their Frobenius norms before the ship (averaging
shrinks norms). value_embeds is not rescaled. The ship is the run's last write: an ANVIL bank's
mantissa is not updated by it.

Use: TailAverages(model.labelled_parameters(), **schedule.tail_settings(), value_embed_updates=
schedule.is_table_event, rank=, world_size=); tick(step) after every optimizer step (the record:
after each train_step), ship() once before the final validation.
"""
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from model.collectives import all_gather_segments, is_distributed, own_segment

TAIL_EMA_BLEND = 0.65   # tail_average.py: lm_head, embed ship lerp(W, A, 0.65)
BANK_BLEND = 0.55       # tail_average.py: the banks ship lerp(W, A, 0.55) ...
RICHARDSON_W = 0.2007   # ... less this on vo / mlp
TAIL_PERIOD = 4         # tail_average.py: tail-avg and bank-blend tick every 4th step
DECONTRACTION_LABELS = ("embed", "lm_head", "mlp_bank", "qk_bank", "vo_bank")
TAIL_LABELS = ("lm_head", "embed", "qk_bank", "vo_bank", "mlp_bank", "value_embeds")


@dataclass
class _Accumulator:
    tag: str
    labels: tuple[str, ...]
    window: int
    rate: Callable[[int], float | None]  # step -> this step's tick rate, None: no tick
    blend: dict[str, float | None]       # None: ship the average; b: ship lerp(W, A, b)
    bufs: dict[str, torch.Tensor] = field(default_factory=dict)
    seeded: set = field(default_factory=set)


class TailAverages:
    def __init__(self, labelled: dict, *, total_steps: int, ema_window: int, avg_window: int, avg_rate: float,
                 value_embed_updates: Callable[[int], bool], rank: int = 0, world_size: int = 1):
        self.params = {}
        for label in TAIL_LABELS:
            params = labelled.get(label, [])
            if len(params) != 1 or not params[0].is_contiguous() or params[0].numel() % world_size:
                raise ValueError(f"TailAverages: expected one contiguous '{label}' parameter whose size divides "
                                 f"by world_size={world_size}, got {[tuple(p.shape) for p in params]}")
            self.params[label] = params[0]
        self.total, self.rank, self.world_size = total_steps, rank, world_size
        self.distributed = world_size > 1 and is_distributed()
        T = total_steps
        r = 2.0 / (ema_window + 1)

        def tail_ema_rate(s):
            if s % 2 == 0:
                return r if s == T - ema_window else None
            return r if s == T - 1 else -math.expm1(2.0 * math.log1p(-r))

        blend_rate = 2.0 / (ema_window // TAIL_PERIOD + 1)
        self.accumulators = [
            _Accumulator("tail-ema", ("lm_head", "embed"), ema_window, tail_ema_rate,
                         {"lm_head": TAIL_EMA_BLEND, "embed": TAIL_EMA_BLEND}),
            _Accumulator("tail-avg", ("vo_bank", "mlp_bank"), avg_window,
                         lambda s: avg_rate if (T - 1 - s) % TAIL_PERIOD == 0 else None,
                         {"vo_bank": None, "mlp_bank": None}),
            _Accumulator("value-embed-avg", ("value_embeds",), avg_window,
                         lambda s: avg_rate if value_embed_updates(s) else None, {"value_embeds": None}),
            _Accumulator("bank-blend", ("qk_bank", "vo_bank", "mlp_bank"), ema_window,
                         lambda s: blend_rate if s % TAIL_PERIOD == 1 or s >= T - 2 else None,
                         {"qk_bank": BANK_BLEND, "vo_bank": BANK_BLEND - RICHARDSON_W,
                          "mlp_bank": BANK_BLEND - RICHARDSON_W}),
        ]  # in ship order
        for acc in self.accumulators:
            for label in acc.labels:
                acc.bufs[label] = torch.zeros(self._shard(label).shape, dtype=torch.float32,
                                              device=self.params[label].device)

    def _shard(self, label: str) -> torch.Tensor:
        """This rank's flat segment of the weight (the part its optimizer updates)."""
        return own_segment(self.params[label].data.view(-1), self.rank, self.world_size)

    @torch.no_grad()
    def tick(self, step: int) -> None:
        """Fold the weights after `step`'s update into every accumulator whose window and cadence hold it."""
        for acc in self.accumulators:
            if step < self.total - acc.window:
                continue
            rate = acc.rate(step)
            if rate is None:
                continue
            for label in acc.labels:
                if label in acc.seeded:
                    acc.bufs[label].lerp_(self._shard(label).float(), rate)
                else:
                    acc.bufs[label].copy_(self._shard(label))
                    acc.seeded.add(label)

    @torch.no_grad()
    def ship(self) -> None:
        """Write the averages into the weights, gather them, and restore the five norms."""
        before = [self.params[label].data.float().norm() for label in DECONTRACTION_LABELS]
        shipped = []
        for acc in self.accumulators:
            for label in acc.labels:
                if label not in acc.seeded:
                    raise RuntimeError(f"TailAverages: {acc.tag} never ticked {label} (ship after the last step)")
                shard, avg, blend = self._shard(label), acc.bufs[label], acc.blend[label]
                shard.copy_(avg if blend is None else torch.lerp(shard.float(), avg, blend))
                if label not in shipped:
                    shipped.append(label)
        if self.distributed:
            for pending in [all_gather_segments(self.params[label].data.view(-1)) for label in shipped]:
                pending.wait()
        for label, norm in zip(DECONTRACTION_LABELS, before):
            after = self.params[label].data.float().norm()
            if after > 0:  # the float32 ratio as a Python float: the product rounds once, on the store
                self.params[label].data.mul_((norm / after).item())

    def reset(self) -> None:
        """Every accumulator unseeded (the post-warm-up reset; the warm-up ticks none)."""
        for acc in self.accumulators:
            acc.seeded.clear()
            for buf in acc.bufs.values():
                buf.zero_()
