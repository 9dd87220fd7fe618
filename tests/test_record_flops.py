"""model/record_flops.py against a count by hand of a tiny RecordGPT (d 64, 4 heads of 16, MLP 224, vocabulary
256), and its mean-keys rule against the attention mask's definition position by position."""
import pytest

from model.record_flops import forward_flops_per_token, mean_keys, train_flops_per_token
from model.record_gpt import RecordConfig
from train.record_schedule import RecordSchedule

TINY = RecordConfig(vocab_size=256, model_dim=64, n_head=4, head_dim=16, mlp_hidden=224, n_hint_kinds=8)

# By hand, windows (16, 48) tokens over segments of 32, per token of the forward.
# Projections 2 d (2 H qk + H v) + 2 H v d, widths (qk, v): layers 0, 2, 5 (8, 16); 1, 8 (8, 8); 3, 10 (16, 16)
PROJ = 3 * (2 * 64 * (64 + 64) + 2 * 4 * 16 * 64) + 2 * (2 * 64 * (64 + 32) + 2 * 4 * 8 * 64) \
    + 2 * (2 * 64 * (128 + 64) + 2 * 4 * 16 * 64)                       # 73,728 + 32,768 + 65,536
# Keys a query sees: short window 16 over 32 positions: (1 + ... + 17 + 15 x 17) / 32 = 408 / 32;
# long window 48 over 32: (1 + ... + 32) / 32 = 528 / 32; paired layers: 64 positions under the
# short window: (1 + ... + 17 + 47 x 17) / 64 = 952 / 64.
CORE = 3 * 4 * (2 * 8 + 2 * 16) * 952 / 64 + 2 * 4 * (2 * 8 + 2 * 8) * 408 / 32 \
    + 2 * 4 * (2 * 16 + 2 * 16) * 528 / 32                               # 8,568 + 3,264 + 8,448
MLP = 11 * 2 * (2 * 224 * 64)                                            # 10 layers + layer 8's parallel MLP
# gate and mix networks: W1 64 x 64 in each of 4; W2 lanes x 64 with 17 (pre: 3 x 4 heads + 5), 11 (post:
# 4 heads + 7), 14 (layer 10's mix), 10 (post-loop mix); W2g 10 sources x 1 group x 64
MIX = 2 * (4 * 64 * 64 + (17 + 11 + 14 + 10) * 64 + 10 * 1 * 64)


def test_forward_flops_match_a_hand_count():
    assert (PROJ, CORE, MLP, MIX) == (172_032, 20_280, 630_784, 40_704)
    full = forward_flops_per_token(TINY, windows=(16, 48), segment_tokens=32, candidates=None)
    assert full == PROJ + CORE + MLP + 2 * 64 * 256 + MIX == 896_568
    sampled = forward_flops_per_token(TINY, windows=(16, 48), segment_tokens=32, candidates=128)
    assert full - sampled == 2 * 64 * (256 - 128)  # the LM head over the candidates only


@pytest.mark.parametrize("segment,window", [(1, 0), (1, 5), (7, 0), (7, 3), (7, 6), (7, 50), (64, 16)])
def test_mean_keys_is_the_masks_mean(segment, window):
    # query i sees key j iff i - window <= j <= i inside its segment (model/record_attention.py step 5)
    seen = [sum(1 for j in range(segment) if i - window <= j <= i) for i in range(segment)]
    assert mean_keys(segment, window) == pytest.approx(sum(seen) / segment)


def test_training_step_is_three_forwards_of_the_steps_plan():
    schedule = RecordSchedule(84, block_tokens=16, tokens_per_step=1024, vocab=256)
    for step in (0, 30, 83):
        plan = schedule.plan(step)
        fwd = forward_flops_per_token(TINY, windows=plan.window_tokens, segment_tokens=plan.max_seq_len,
                                      candidates=plan.candidates)
        assert train_flops_per_token(TINY, plan) == 3 * fwd
    # later stages attend further: more FLOPs per token
    assert train_flops_per_token(TINY, schedule.plan(83)) > train_flops_per_token(TINY, schedule.plan(0))
