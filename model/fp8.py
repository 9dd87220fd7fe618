"""FP8 where the record trains in FP8: the attention QKV projection, the relu^2 MLP and the LM head's
loss GEMM, with the record's scales (its perf/kernels/qkv_rope.py, fp8_attention_quant.py, mlp.py,
cross_entropy.py and model/gpt.py). Training only; validation runs in bf16 (the record's).

Every fp8 operand is q = fp8(clamp(v / s, -max, max)) with a per-tensor fp32 scale s (max 448 for
e4m3, 57,344 for e5m2: the clamp makes every cast saturate, where a bare e4m3fn cast of an
out-of-range value would be NaN), and a GEMM of two of them is (qa @ qb) * sa * sb.
  * GPU path (model.device.gpu_paths_enabled()): torch._scaled_mm on the fp8 tensors, fp32 scale
    tensors, fast accumulation on the forward GEMMs only (the record: NaN otherwise). Its schema
    (self, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False)
    is torch 2.13's (read here) and the one the record calls on 2.10; torch 2.11 lies between and keeps it
    (_scaled_mm_v2 superseded it in late 2025, the old op stays for compatibility). Operands that are not
    on a GPU, or shapes it cannot take (a dimension not a multiple of 16), run the CPU form.
  * CPU path: the same quantize, then a float32 matmul of the dequantized operands: the numbers
    _scaled_mm computes, up to its accumulation order and output rounding.

The sites and their scales (all from the record):
  QKV   x e4m3 at 8/448 (static: saturates beyond |8|); W e4m3 at its exact amax/448 (each forward
        reads the current weights, so this is the record's "refreshed after every update"); the
        output's gradient e4m3 at 1/448; an optional gain (the record's l_qkv) folds into W's scale.
  MLP   relu(x W_fc^T)^2 W_proj. x e4m3 at 2^-4; W_fc, W_proj e4m3 per bank slot (Fp8MLPScales:
        exact amax/448 for the first 16 refreshes after init or reset, then the previous refresh's
        amax * 1.12 / 448); relu^2 e4m3 at the last steps' amax * 1.03 / 448 (1.0 until an amax is
        recorded); the incoming gradient e5m2 at 2^-6; dpre = 2 dpost relu(pre) (relu(pre) rebuilt as
        sqrt of the e4m3 relu^2, as the record's kernel) e5m2 at amax * 1.25 / 57,344 (2^-6 until one).
  LM    x e4m3 at 100/448, lm_head e4m3 at 2/448 (static), the logits rounded to e4m3 (the record
        stores them so), their gradient e5m2 at 0.75/8/448.
Not ported: the record folds the MLP's residual post-lambda into the down projection's scale (a
fusion; the model multiplies the MLP output instead, the same product).
"""
import torch
from torch import nn

from model.device import gpu_paths_enabled

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP8_MAX = {E4M3: 448.0, E5M2: 57344.0}  # torch.finfo(...).max: the largest finite value of each format

# Attention QKV (the record's model/gpt.py FP8_ATTN_X_SCALE / FP8_ATTN_GRAD_SCALE, from its record #360)
QKV_X_SCALE = 8.0 / 448.0
QKV_GRAD_SCALE = 1.0 / 448.0
# MLP (the record's model/gpt.py and perf/kernels/mlp.py)
MLP_X_SCALE = 2.0 ** -4            # post-RMS-norm rows have |x| <= sqrt(d) = 22.6 at d = 512 < 448 * 2^-4
MLP_GRAD_SCALE = 2.0 ** -6         # the incoming gradient, e5m2; also dpre's scale until an amax is recorded
MLP_POST_HEADROOM = 1.03           # relu^2 scale = recorded amax * 1.03 / 448
MLP_DPRE_HEADROOM = 1.25           # dpre scale = recorded amax * 1.25 / 57344
MLP_WEIGHT_HEADROOM = 1.12         # delayed weight scale = previous amax * 1.12 / 448 (WEIGHT_SCALE_HEADROOM)
MLP_EXACT_SCALE_REFRESHES = 16     # FP8_EXACT_SCALE_CALLS: exact weight scales for the first 16 refreshes
MLP_POST_SCALE_FLOOR, MLP_DPRE_SCALE_FLOOR = 1e-6, 1e-12  # its _refresh_delayed_scale floors
AMAX_CEILING = 1e12                # its clamp on a recorded amax (NaN and inf count as 0: no update)
# LM head (the record's CastedLinearT scales; the /8 on the gradient scale is an exact binade shift)
LM_X_SCALE = 100.0 / 448.0
LM_W_SCALE = 2.0 / 448.0
LM_GRAD_SCALE = (0.75 / 8.0) / 448.0
SCALED_MM_ALIGN = 16               # torch._scaled_mm wants every dimension a multiple of 16


def quantize(v, scale, dtype):
    """fp8 `dtype` copy of v / scale, saturated to the format's range (scale: a float or 0-d tensor)."""
    m = FP8_MAX[dtype]
    return (v.float() / scale).clamp(-m, m).to(dtype)


def round_trip(v, scale, dtype):
    """quantize, then back to float32: the value an fp8 operand stands for."""
    return quantize(v, scale, dtype).float() * scale


def exact_scale(w, fmt_max=448.0):
    """The record's exact weight scale: max |w| / 448 in float32 (floored at 1e-12 for a zero weight)."""
    return w.detach().abs().amax().float().clamp(min=1e-12) / fmt_max


def _as_scale(s, device):
    return s.detach().float().reshape(()).to(device) if torch.is_tensor(s) else torch.tensor(float(s), device=device)


def scaled_mm(a, b, scale_a, scale_b, out_dtype, fast_accum):
    """The GPU path: torch._scaled_mm(a, b) * scale_a * scale_b, with a row-major and b column-major
    (copied into those layouts when they are not). An fp8 out_dtype stores the rounded product."""
    a = a if a.stride(-1) == 1 else a.contiguous()
    b = b if b.stride(0) == 1 else b.t().contiguous().t()
    return torch._scaled_mm(a, b, scale_a=_as_scale(scale_a, a.device), scale_b=_as_scale(scale_b, a.device),
                            out_dtype=out_dtype, use_fast_accum=fast_accum)


def emulated_mm(a, b, scale_a, scale_b, out_dtype):
    """The CPU path: float32 (a @ b) * scale_a * scale_b, saturated and rounded to an fp8 out_dtype."""
    out = (a.float() @ b.float()) * (_as_scale(scale_a, a.device) * _as_scale(scale_b, a.device))
    if out_dtype in FP8_MAX:
        out = out.clamp(-FP8_MAX[out_dtype], FP8_MAX[out_dtype])
    return out.to(out_dtype)


def use_scaled_mm(a, b):
    """The GPU path's condition: the switch is on, the operands are on a GPU and their shapes fit."""
    return gpu_paths_enabled() and a.is_cuda and all(n % SCALED_MM_ALIGN == 0 for n in (*a.shape, b.shape[1]))


def fp8_mm(a, b, scale_a, scale_b, out_dtype, fast_accum=False):
    """(a @ b) * scale_a * scale_b for fp8 a (M, K) and b (K, N): scaled_mm on the GPU path, else emulated_mm."""
    if use_scaled_mm(a, b):
        return scaled_mm(a, b, scale_a, scale_b, out_dtype, fast_accum)
    return emulated_mm(a, b, scale_a, scale_b, out_dtype)


class Fp8Linear(torch.autograd.Function):
    """y = x @ (gain * w)^T from e4m3 x and w; the gradient of y quantized to `grad_dtype`.
    x (T, in), w (out, in), gain a 0-d tensor or None; with logits_e4m3, y is rounded to e4m3 and
    returned in float32 (the LM head)."""

    @staticmethod
    def forward(ctx, x, w, gain, x_scale, w_scale, grad_scale, grad_dtype, logits_e4m3):
        w_scale_gain = w_scale * gain.detach().float() if gain is not None else w_scale
        xq, wq = quantize(x, x_scale, E4M3), quantize(w, w_scale, E4M3)
        out_dtype = E4M3 if logits_e4m3 else x.dtype
        y = fp8_mm(xq, wq.t(), x_scale, w_scale_gain, out_dtype, fast_accum=True)
        ctx.save_for_backward(xq, wq, w if gain is not None else None, gain)
        ctx.scales = (x_scale, w_scale, w_scale_gain, grad_scale, grad_dtype, x.dtype, w.dtype)
        return y.float() if logits_e4m3 else y

    @staticmethod
    def backward(ctx, grad_y):
        xq, wq, w, gain = ctx.saved_tensors
        x_scale, w_scale, w_scale_gain, grad_scale, grad_dtype, x_dtype, w_dtype = ctx.scales
        gq = quantize(grad_y, grad_scale, grad_dtype)
        grad_x = fp8_mm(gq, wq, grad_scale, w_scale_gain, x_dtype)
        grad_w = fp8_mm(gq.t(), xq, grad_scale, x_scale, w_dtype)  # d/d(gain * w)
        grad_gain = None
        if gain is not None:
            grad_gain = (grad_w.float() * w.float()).sum().to(gain.dtype)
            grad_w = grad_w * gain.detach().to(w_dtype)
        return grad_x, grad_w, grad_gain, None, None, None, None, None


def fp8_linear(x, w, *, x_scale, grad_scale, w_scale=None, gain=None, grad_dtype=E4M3, logits_e4m3=False):
    """x @ (gain * w)^T through Fp8Linear; x (..., in), w (out, in); w_scale defaults to exact_scale(w)."""
    w_scale = exact_scale(w) if w_scale is None else w_scale
    y = Fp8Linear.apply(x.reshape(-1, x.shape[-1]), w, gain, x_scale, w_scale, grad_scale, grad_dtype, logits_e4m3)
    return y.view(*x.shape[:-1], w.shape[0])


def qkv_linear(x, w, gain=None):
    """The attention projection in fp8 at the record's scales: x @ (gain * w)^T, w the packed [Q; K; V]
    rows (out, d) of one layer."""
    return fp8_linear(x, w, x_scale=QKV_X_SCALE, grad_scale=QKV_GRAD_SCALE, gain=gain)


def lm_head_logits(x, w_rows):
    """The LM head's training logits x @ w_rows^T, e4m3-rounded, float32; w_rows (classes, d) are the
    rows of the classes scored (lm_head^T, or its candidate rows under sampled softmax)."""
    return fp8_linear(x, w_rows, x_scale=LM_X_SCALE, w_scale=LM_W_SCALE, grad_scale=LM_GRAD_SCALE,
                      grad_dtype=E5M2, logits_e4m3=True)


class Fp8MLPScales(nn.Module):
    """The MLP bank's fp8 scale state, one entry per slot (the record's _mlp_* buffers, not in the
    state_dict). refresh() after init, after reset() and after every optimizer update, before the next
    forward; the forward and backward record the amaxes the next refresh reads."""

    def __init__(self, n_slots, exact_refreshes: int = MLP_EXACT_SCALE_REFRESHES):
        super().__init__()
        # exact weight scales for the first exact_refreshes refreshes (the record's 16; a run scaled to
        # fewer steps scales it too: train/record_schedule.py fp8_exact_refreshes)
        self.exact_refreshes = exact_refreshes
        self.refreshes = 0  # a host counter toward exact_refreshes, as the record's
        for name, value in (("fc_scale", 1.0), ("proj_scale", 1.0), ("fc_amax", 0.0), ("proj_amax", 0.0),
                            ("post_scale", 1.0), ("post_amax", 0.0), ("dpre_scale", MLP_GRAD_SCALE),
                            ("dpre_amax", 0.0)):
            self.register_buffer(name, torch.full((n_slots,), value), persistent=False)

    @torch.no_grad()
    def refresh(self, w_fc, w_proj):
        """New scales from the slots' current weights w_fc, w_proj (n_slots, hidden, d) and the amaxes
        recorded since the last refresh."""
        exact = self.refreshes < self.exact_refreshes
        self.refreshes += 1
        for w, scale, amax in ((w_fc, self.fc_scale, self.fc_amax), (w_proj, self.proj_scale, self.proj_amax)):
            w = w.detach().reshape(w.shape[0], -1)
            if exact:  # computed in the weights' own dtype, as the record's (bf16 there)
                scale.copy_((w.abs().amax(dim=1).clamp(min=1e-12) / FP8_MAX[E4M3]).float())
            else:
                scale.copy_((amax * (MLP_WEIGHT_HEADROOM / FP8_MAX[E4M3])).clamp(min=1e-12))
            amax.copy_(w.abs().amax(dim=1).float())  # read by the next refresh
        for amax, scale, gain, floor in ((self.post_amax, self.post_scale, MLP_POST_HEADROOM / FP8_MAX[E4M3],
                                          MLP_POST_SCALE_FLOOR),
                                         (self.dpre_amax, self.dpre_scale, MLP_DPRE_HEADROOM / FP8_MAX[E5M2],
                                          MLP_DPRE_SCALE_FLOOR)):
            a = torch.nan_to_num(amax, nan=0.0, posinf=0.0, neginf=0.0).clamp(max=AMAX_CEILING)
            scale.copy_(torch.where(a > 0, (a * gain).clamp(min=floor), scale))  # no amax yet: keep the scale
            amax.zero_()

    @torch.no_grad()
    def reset(self):
        """The post-warm-up reset: exact weight scales again, no recorded amax, the initial scales."""
        self.refreshes = 0
        for amax in (self.fc_amax, self.proj_amax, self.post_amax, self.dpre_amax):
            amax.zero_()
        self.post_scale.fill_(1.0)
        self.dpre_scale.fill_(MLP_GRAD_SCALE)


def _record_amax(buffer, slot, value):
    buffer[slot] = torch.maximum(buffer[slot], value.detach().float().amax())


class Fp8MLP(torch.autograd.Function):
    """relu(x w_fc^T)^2 w_proj with the record's fp8 dataflow; x (T, d), w_fc and w_proj (hidden, d)."""

    @staticmethod
    def forward(ctx, x, w_fc, w_proj, scales, slot):
        s = scales
        xq = quantize(x, MLP_X_SCALE, E4M3)
        fcq, projq = quantize(w_fc, s.fc_scale[slot], E4M3), quantize(w_proj, s.proj_scale[slot], E4M3)
        pre = fp8_mm(xq, fcq.t(), MLP_X_SCALE, s.fc_scale[slot], x.dtype, fast_accum=True)
        post = torch.relu(pre).square()
        _record_amax(s.post_amax, slot, post)
        post_scale = s.post_scale[slot].clone()  # the backward reads this step's scale, not a refreshed one
        postq = quantize(post, post_scale, E4M3)
        out = fp8_mm(postq, projq, post_scale, s.proj_scale[slot], x.dtype, fast_accum=True)
        ctx.save_for_backward(xq, fcq, projq, postq, post_scale, s.fc_scale[slot].clone(),
                              s.proj_scale[slot].clone(), s.dpre_scale[slot].clone())
        ctx.scales, ctx.slot, ctx.dtypes = scales, slot, (x.dtype, w_fc.dtype, w_proj.dtype)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        xq, fcq, projq, postq, post_scale, fc_scale, proj_scale, dpre_scale = ctx.saved_tensors
        x_dtype, fc_dtype, proj_dtype = ctx.dtypes
        gq = quantize(grad_out, MLP_GRAD_SCALE, E5M2)
        grad_proj = fp8_mm(postq.t(), gq, post_scale, MLP_GRAD_SCALE, proj_dtype)
        dpost = fp8_mm(gq, projq.t(), MLP_GRAD_SCALE, proj_scale, torch.float32)
        dpre = (2.0 * dpost * torch.sqrt(postq.float() * post_scale)).to(x_dtype)  # relu(pre) from the e4m3 post
        _record_amax(ctx.scales.dpre_amax, ctx.slot, dpre.abs())
        dpreq = quantize(dpre, dpre_scale, E5M2)
        grad_fc = fp8_mm(dpreq.t(), xq, dpre_scale, MLP_X_SCALE, fc_dtype)
        grad_x = fp8_mm(dpreq, fcq, dpre_scale, fc_scale, x_dtype)
        return grad_x, grad_fc, grad_proj, None, None


def fp8_mlp(x, w_fc, w_proj, scales, slot):
    """relu(x @ w_fc^T)^2 @ w_proj in fp8 with bank slot `slot`'s scales; x (..., d), w_fc, w_proj (hidden, d)."""
    if scales.refreshes == 0:
        raise RuntimeError("fp8_mlp: Fp8MLPScales.refresh() must run after init and after reset(), before a forward")
    y = Fp8MLP.apply(x.reshape(-1, x.shape[-1]), w_fc, w_proj, scales, slot)
    return y.view(*x.shape[:-1], w_proj.shape[1])
