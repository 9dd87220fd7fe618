"""One optimizer step of a run: the schedules (learning rate, Muon momentum, attention window),
forward and backward, gradient averaging across ranks, clipping, the optimizers.

Gradients are averaged one of two ways (`--grad-sync`): "allreduce" reduces them all after
backward; "overlap" (model/grad_sync.py) reduces them in buckets started while backward runs,
and Muon reduce-scatters its own matrices. The schedules follow the arch's recipe: speedrun
(modded-nanogpt) holds the learning rate, then cools it down linearly over the last 40%; gpt2
(llm.c) warms up over 700 of 18,865 steps (scaled to the run's length), then decays it to 0
along a cosine over the whole run and clips gradients at norm 1.0.
"""
import torch

from hints import n_kinds
from hints.kinds import n_cells
from model import (GPT, GPTConfig, GradSync, Muon, allreduce_grads, attention_window_blocks, autocast_context,
                   build_optimizers, gpu_paths_enabled, lr_multiplier, muon_momentum)
from model.device import torch_compile

SPEEDRUN_COOLDOWN_FRAC = 0.4  # modded-nanogpt: constant lr, then linear cool-down over the last 40%
LLMC_STEPS = 18_865           # llm.c GPT-2 124M: 10B tokens at 524,288 per step
GPT2_WARMUP_FRAC = 700 / LLMC_STEPS
GPT2_GRAD_CLIP = 1.0


class TrainStep:
    """`step(item, i)`: train on one prepared batch (train/hint_prep.py's Prepared) as step i of
    `total`; returns the loss as a device tensor (read later, so the step does not sync)."""

    def __init__(self, model, train_model, optimizers, *, total, grad_sync, muon_warmup, device, compiled="off"):
        self.model, self.train_model, self.optimizers, self.device = model, train_model, optimizers, device
        self.compiled = compiled
        self.total, self.muon_warmup = total, muon_warmup
        self.sync = GradSync(model, optimizers) if grad_sync == "overlap" else None
        self.gpt2 = model.cfg.arch == "gpt2"
        self.lr_warmup, self.cooldown = (round(GPT2_WARMUP_FRAC * total), 1.0) if self.gpt2 else (0, SPEEDRUN_COOLDOWN_FRAC)
        self.lr_shape = "cosine" if self.gpt2 else "linear"

    def describe(self):
        return (f"lr warm-up {self.lr_warmup} steps, {self.lr_shape} decay over {self.cooldown:.0%}, Muon momentum warm-up "
                f"{self.muon_warmup} steps, grad sync {'overlap' if self.sync else 'allreduce'}, compile {self.compiled}")

    def set_schedules(self, step):
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["lr"] = group["initial_lr"] * lr_multiplier(step, self.total, self.lr_warmup, self.cooldown,
                                                                         self.lr_shape)
                if isinstance(opt, Muon):
                    group["momentum"] = muon_momentum(step, self.muon_warmup)
        cfg = self.model.cfg
        if cfg.window_attn:
            self.model.set_window_blocks(attention_window_blocks(step, self.total, cfg.attn_block_size))

    def __call__(self, item, step):
        to = lambda t: t.to(self.device, non_blocking=True) if t is not None else None  # noqa: E731
        self.set_schedules(step)
        with autocast_context(self.device):
            loss = self.train_model(to(item.x), to(item.y), to(item.hint_tokens), to(item.hint_kinds),
                                   to(item.hint_weights))
        loss.backward()
        self.sync.wait() if self.sync else allreduce_grads(self.model)
        if self.gpt2:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), GPT2_GRAD_CLIP)
        for opt in self.optimizers:
            opt.step()
        self.sync.zero_grad() if self.sync else self.model.zero_grad(set_to_none=True)
        return loss.detach()


def build_config(args):
    """The GPTConfig of the trainer's flags: the arch and its backbone features, hint lengths and
    representation (their kind or cell count). Flags that make no valid model end the run in one line."""
    speedrun = dict(unet_skips=args.unet_skips, embed_skips=args.embed_skips, value_embeds=args.value_embeds,
                    window_attn=args.window_attn, no_attn_layers=args.no_attn_layers, rope=args.rope,
                    attn_block_size=args.attn_block_size, head_init_std=getattr(args, "head_init_std", 0.0))
    K = len(args.hint_lengths)
    repr_ = getattr(args, "hint_repr", "lengths")
    try:
        cfg = GPTConfig(vocab_size=args.vocab_size, n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                        arch=args.arch, max_seq_len=args.seq_len, n_hint_lengths=K, hint_repr=repr_,
                        n_hint_kinds=n_cells(K) if repr_ == "record" else n_kinds(K),
                        **(speedrun if args.arch == "speedrun" else {}))
    except ValueError as e:
        raise SystemExit(f"error: model: {e}") from None
    return cfg


def build_model(args, d, total):
    """(model, the module that trains (compiled or not), optimizers, TrainStep) from the trainer's
    flags (build_config), grad sync and compile mode."""
    model = GPT(build_config(args)).to(d.device)
    if args.arch == "speedrun" and gpu_paths_enabled() and d.cuda:
        model.cast_embeddings(torch.bfloat16)  # the record's bf16 embedding tables (before the optimizers)
    optimizers = build_optimizers(model, arch=args.arch, lr_scale=args.lr_scale, rank=d.rank, world_size=d.world_size,
                                  grad_sync=args.grad_sync)
    compile_model = gpu_paths_enabled() if args.compile is None else args.compile
    if compile_model and args.compile_mode == "regions":
        train_model = model.compile_regions()  # in place: the same module, its blocks compiled
    else:
        train_model = torch_compile(model) if compile_model else model
    step = TrainStep(model, train_model, optimizers, total=total, grad_sync=args.grad_sync,
                     muon_warmup=args.muon_momentum_warmup, device=d.device,
                     compiled=args.compile_mode if compile_model else "off")
    return model, train_model, optimizers, step
