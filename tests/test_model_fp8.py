"""Tests for model/fp8.py: the fp8 round trip equals a plain nearest-value statement, the record's static
scales saturate where they should, the MLP's delayed-scale state machine, the three sites against a plain
quantize-dequantize statement (exactly) and against float32 (within fp8's error), and the GPU path's
torch._scaled_mm code run here on CPU tensors."""
import numpy as np
import pytest
import torch

from model import fp8

pytestmark = pytest.mark.usefixtures("one_torch_thread")

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def plain_round_trip(v, scale, dtype):
    """Nearest finite value of the format to v / scale (ties to the even code), saturating; times scale.
    The format's values come from its 256 bit patterns, not from a cast."""
    codes = torch.arange(128, dtype=torch.uint8)  # sign bit clear: the magnitudes, in code order
    magnitudes = codes.view(dtype).float().numpy().astype(np.float64)
    finite = np.isfinite(magnitudes)
    magnitudes, codes = magnitudes[finite], codes.numpy()[finite]
    y = (v.double() / float(scale)).numpy()
    a = np.minimum(np.abs(y), magnitudes.max())
    distance = np.abs(a[:, None] - magnitudes[None, :])
    best = distance.min(axis=1, keepdims=True)
    ties = distance == best
    pick = np.where(ties & (codes[None, :] % 2 == 0), 1, 0) + ties  # among the nearest, prefer an even code
    q = magnitudes[np.argmax(pick, axis=1)] * np.sign(y)
    return torch.from_numpy(q * float(scale)).float()


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_round_trip_is_the_nearest_value_and_saturates(dtype):
    torch.manual_seed(0)
    scale = 2.0 ** -5
    top = fp8.FP8_MAX[dtype] * scale
    v = torch.cat([torch.randn(4000) * top / 8, torch.randn(2000) * top * 1e-4,  # normal and subnormal ranges
                   torch.tensor([0.0, top, -top, 1.5 * top, -1e30, 1e30])])       # the edge and far past it
    assert torch.equal(fp8.round_trip(v, scale, dtype), plain_round_trip(v, scale, dtype))
    assert fp8.round_trip(torch.tensor([1e30]), scale, dtype).item() == top  # saturates, never inf or NaN


def test_static_scales_saturate_at_the_records_bounds():
    big = torch.tensor([1e4, -1e4])
    assert fp8.round_trip(big, fp8.QKV_X_SCALE, E4M3).tolist() == [8.0, -8.0]           # QKV input: |x| <= 8
    assert fp8.round_trip(big, fp8.MLP_X_SCALE, E4M3).tolist() == [28.0, -28.0]         # MLP input: 448 / 16
    assert fp8.round_trip(big, fp8.LM_X_SCALE, E4M3).tolist() == [100.0, -100.0]        # LM input: 100
    assert fp8.round_trip(big, fp8.QKV_GRAD_SCALE, E4M3).tolist() == [1.0, -1.0]        # QKV gradient: 1
    assert fp8.round_trip(big * 1e3, fp8.MLP_GRAD_SCALE, E5M2).tolist() == [896.0, -896.0]  # 57344 / 64
    # through the QKV projection: an input entry beyond 8 acts as 8
    w = torch.randn(16, 4)
    x = torch.tensor([[50.0, 1.0, -2.0, 0.5]])
    assert torch.equal(fp8.qkv_linear(x, w), fp8.qkv_linear(x.clamp(-8, 8), w))


def plain_linear(x, w, x_scale, w_scale, grad, grad_scale, grad_dtype, gain=1.0):
    """y, dx, dw, dgain of y = x (gain w)^T with every operand quantize-dequantized, written out plainly."""
    q = lambda v, s, dt: (v / s).clamp(-fp8.FP8_MAX[dt], fp8.FP8_MAX[dt]).to(dt).float() * s
    xr, wr, gr = q(x, x_scale, E4M3), q(w, w_scale, E4M3), q(grad, grad_scale, grad_dtype)
    dw_of_product = gr.t() @ xr
    return xr @ wr.t() * gain, gr @ wr * gain, dw_of_product * gain, (dw_of_product * w).sum()


def relative_error(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_fp8_linear_equals_the_plain_statement_and_fp32_within_fp8_error():
    torch.manual_seed(1)
    x = torch.randn(64, 96, requires_grad=True)
    w = (torch.randn(80, 96) * 0.05).requires_grad_()
    gain = torch.tensor(0.7, requires_grad=True)
    y = fp8.qkv_linear(x, w, gain)
    grad = torch.randn(64, 80) * 0.01
    y.backward(grad)
    w_scale = w.detach().abs().max() / 448
    ref = plain_linear(x.detach(), w.detach(), 8 / 448, w_scale, grad, 1 / 448, E4M3, gain=0.7)
    for got, want in zip((y, x.grad, w.grad, gain.grad), ref):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # against float32: e4m3 keeps 3 mantissa bits, a relative rounding error of at most 2^-4 per operand and
    # about 2^-4 / sqrt(3) = 3.6% RMS; a product of two rounded operands, about 5%
    xf, wf = x.detach(), w.detach()
    assert relative_error(y.detach(), 0.7 * xf @ wf.t()) < 0.08
    assert relative_error(x.grad, 0.7 * grad @ wf) < 0.08
    assert relative_error(w.grad, 0.7 * grad.t() @ xf) < 0.08


def test_lm_head_logits_are_e4m3_values_and_their_gradient_e5m2():
    torch.manual_seed(2)
    x = torch.randn(32, 64, requires_grad=True)
    w = (torch.randn(64, 200) * 0.005).requires_grad_()  # lm_head (d, classes), the record's std
    logits = fp8.lm_head_logits(x * 3, w.t())
    assert logits.dtype == torch.float32
    assert torch.equal(logits, logits.to(E4M3).float())  # stored e4m3, as the record's logit GEMM
    # magnitudes down to e5m2's subnormals at this scale, where a scale 8x off (an exact binade shift elsewhere) shows
    grad = torch.randn(32, 200) * 10 ** torch.empty(32, 200).uniform_(-9, -2)
    logits.backward(grad)
    ref = plain_linear(3 * x.detach(), w.detach().t(), 100 / 448, 2 / 448, grad, 0.75 / 8 / 448, E5M2)
    torch.testing.assert_close(logits, ref[0].to(E4M3).float(), rtol=0, atol=0)
    torch.testing.assert_close(x.grad, 3 * ref[1], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(w.grad, ref[2].t(), rtol=1e-5, atol=1e-7)


def plain_mlp(x, w_fc, w_proj, fc_scale, proj_scale, post_scale, dpre_scale, grad):
    """out, dx, dw_fc, dw_proj of the record's fp8 MLP dataflow, written out plainly (float32)."""
    q = lambda v, s, dt: (v / s).clamp(-fp8.FP8_MAX[dt], fp8.FP8_MAX[dt]).to(dt).float() * s
    xr, fcr, projr = q(x, 2 ** -4, E4M3), q(w_fc, fc_scale, E4M3), q(w_proj, proj_scale, E4M3)
    post = torch.relu(xr @ fcr.t()) ** 2
    postr = q(post, post_scale, E4M3)
    gr = q(grad, 2 ** -6, E5M2)
    dpre = 2 * (gr @ projr.t()) * postr.sqrt()
    dprer = q(dpre, dpre_scale, E5M2)
    return postr @ projr, dprer @ fcr, dprer.t() @ xr, postr.t() @ gr, post.max(), dpre.abs().max()


def test_fp8_mlp_equals_the_plain_statement_and_fp32_within_fp8_error():
    torch.manual_seed(3)
    d, hidden, slots = 64, 128, 3
    fc = torch.randn(slots, hidden, d) * 0.05
    proj = torch.randn(slots, hidden, d) * 0.05
    scales = fp8.Fp8MLPScales(slots)
    scales.refresh(fc, proj)
    x = torch.randn(40, d)
    for step in range(2):  # step 0 at the initial activation scales, step 1 at the delayed ones they set
        xs = x.clone().requires_grad_()
        w_fc, w_proj = fc[1].clone().requires_grad_(), proj[1].clone().requires_grad_()
        post_scale, dpre_scale = scales.post_scale[1].item(), scales.dpre_scale[1].item()
        out = fp8.fp8_mlp(xs, w_fc, w_proj, scales, slot=1)
        grad = torch.randn_like(out) * 0.05
        out.backward(grad)
        ref = plain_mlp(x, fc[1], proj[1], scales.fc_scale[1], scales.proj_scale[1], post_scale, dpre_scale, grad)
        for got, want in zip((out, xs.grad, w_fc.grad, w_proj.grad, scales.post_amax[1], scales.dpre_amax[1]), ref):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
        assert scales.post_amax[0] == 0 and scales.post_amax[2] == 0  # only slot 1 ran
        scales.refresh(fc, proj)
    # at the delayed scales, against float32: e4m3 operands (3 mantissa bits), e5m2 gradients (2 bits, up to
    # 2^-3 relative per operand) through a squared activation: a few percent, 15% on the e5m2 chains
    post = torch.relu(x @ fc[1].t()) ** 2
    assert relative_error(out.detach(), post @ proj[1]) < 0.08
    dpre = 2 * (grad @ proj[1].t()) * post.sqrt()
    assert relative_error(xs.grad, dpre @ fc[1]) < 0.15
    assert relative_error(w_fc.grad, dpre.t() @ x) < 0.15
    assert relative_error(w_proj.grad, post.t() @ grad) < 0.15


@pytest.mark.parametrize("exact", [16, 3])  # the record's count, and one scaled to a short run
def test_mlp_scale_state_machine(exact):
    torch.manual_seed(4)
    base_fc, base_proj = torch.randn(2, 16, 8), torch.randn(2, 16, 8)
    scales = fp8.Fp8MLPScales(2) if exact == 16 else fp8.Fp8MLPScales(2, exact_refreshes=exact)
    with pytest.raises(RuntimeError, match="refresh"):
        fp8.fp8_mlp(torch.randn(4, 8), base_fc[0], base_proj[0], scales, 0)
    amax = lambda w: w.abs().amax(dim=(1, 2))
    growth = lambda k: 1.0 + 0.05 * k  # the weights grow 5% per update
    for k in range(20):
        fc, proj = base_fc * growth(k), base_proj * growth(k)
        scales.refresh(fc, proj)
        if k < exact:  # exact: this refresh's own amax / 448
            torch.testing.assert_close(scales.fc_scale, amax(fc) / 448)
            torch.testing.assert_close(scales.proj_scale, amax(proj) / 448)
        else:       # delayed: the previous refresh's amax * 1.12 / 448
            torch.testing.assert_close(scales.fc_scale, amax(base_fc * growth(k - 1)) * 1.12 / 448)
            torch.testing.assert_close(scales.proj_scale, amax(base_proj * growth(k - 1)) * 1.12 / 448)
    # no forward yet: the activation scales stay at their initial values
    assert scales.post_scale.tolist() == [1.0, 1.0] and scales.dpre_scale.tolist() == [2 ** -6] * 2
    x = torch.randn(6, 8, requires_grad=True)
    fp8.fp8_mlp(x, fc[0], proj[0], scales, 0).sum().backward()
    post_amax, dpre_amax = scales.post_amax[0].item(), scales.dpre_amax[0].item()
    assert post_amax > 0 and dpre_amax > 0 and scales.post_amax[1] == 0
    scales.refresh(fc, proj)
    assert scales.post_scale[0].item() == pytest.approx(post_amax * 1.03 / 448)
    assert scales.dpre_scale[0].item() == pytest.approx(dpre_amax * 1.25 / 57344)
    assert scales.post_scale[1] == 1.0 and scales.dpre_scale[1] == 2 ** -6  # slot 1 never ran: kept
    assert scales.post_amax.tolist() == [0.0, 0.0]  # cleared for the next steps
    scales.post_amax[1] = float("nan")  # a NaN amax updates nothing
    scales.refresh(fc, proj)
    assert scales.post_scale[1] == 1.0
    scales.reset()
    assert scales.refreshes == 0 and scales.post_scale.tolist() == [1.0, 1.0]
    assert scales.dpre_scale.tolist() == [2 ** -6] * 2 and not scales.dpre_amax.any()
    scales.refresh(fc * 3, proj * 3)  # exact again after the reset
    torch.testing.assert_close(scales.fc_scale, amax(fc * 3) / 448)


def test_the_gpu_path_runs_scaled_mm_and_agrees_with_the_cpu_path(monkeypatch):
    """torch._scaled_mm has a CPU kernel in this torch: the GPU path's own code runs here, end to end."""
    torch.manual_seed(5)
    a = fp8.quantize(torch.randn(32, 48), 0.01, E4M3)
    b = fp8.quantize(torch.randn(64, 48), 0.02, E4M3).t()  # column-major, as a weight's transpose
    try:
        got = fp8.scaled_mm(a, b, 0.01, 0.02, torch.float32, fast_accum=True)
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"this torch build has no CPU torch._scaled_mm: {e}")
    torch.testing.assert_close(got, fp8.emulated_mm(a, b, 0.01, 0.02, torch.float32), rtol=1e-5, atol=1e-5)
    e4m3_out = fp8.scaled_mm(a, b.contiguous(), 0.01, 0.02, E4M3, fast_accum=True)  # row-major b is re-laid
    assert torch.equal(e4m3_out.float(), fp8.emulated_mm(a, b, 0.01, 0.02, E4M3).float())

    def run(gpu):  # the GPU path's condition, minus "on a GPU"
        monkeypatch.setattr(fp8, "use_scaled_mm", lambda a, b: gpu and all(n % 16 == 0 for n in (*a.shape, b.shape[1])))
        torch.manual_seed(6)
        x = torch.randn(32, 64, requires_grad=True)
        w = (torch.randn(48, 64) * 0.05).requires_grad_()
        fc, proj = (torch.randn(1, 128, 64) * 0.05).requires_grad_(), (torch.randn(1, 128, 64) * 0.05).requires_grad_()
        scales = fp8.Fp8MLPScales(1)
        scales.refresh(fc, proj)
        loss = (fp8.qkv_linear(x, w) ** 2).sum() + fp8.fp8_mlp(x, fc[0], proj[0], scales, 0).sum() \
            + fp8.lm_head_logits(x, w).sum()
        loss.backward()
        return loss.detach(), x.grad, w.grad, fc.grad, proj.grad

    for got, want in zip(run(gpu=True), run(gpu=False)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
