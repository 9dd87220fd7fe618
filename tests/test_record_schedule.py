"""train/record_schedule.py: at 570 steps every value is the sheet's (RECORD.md sections 3, 6, 9, 10,
11, 12, stated plainly here); at any length from MIN_STEPS every stage and switch happens, in the
record's order, with no stage empty."""
import pytest
import torch

from train.record_schedule import MIN_STEPS, RecordSchedule


def values_by_step(schedule, fn):
    return [fn(schedule.plan(s)) for s in range(schedule.steps)]


def runs(values):
    """[(first step, value)] at each change."""
    return [(i, v) for i, v in enumerate(values) if i == 0 or v != values[i - 1]]


def test_the_record_at_570_steps():
    s = RecordSchedule(570)
    d = s.describe()
    assert (d["steps"], d["scheduled_steps"], d["extension_steps"], d["tokens_per_step"]) == (570, 560, 10, 131072)
    assert [(st["first_step"], st["last_step"]) for st in d["stages"]] == [(0, 159), (160, 339), (340, 525),
                                                                         (526, 559), (560, 569)]
    # windows in 128-token blocks: 1/3 to 159, 3/7 to 339, 5/11 to 559, 6/13 to 569; final validation 6/20
    assert d["window_schedule"] == [[0, 1, 3], [160, 3, 7], [340, 5, 11], [560, 6, 13]]
    assert runs(values_by_step(s, lambda p: p.window_tokens)) == [(0, (128, 384)), (160, (384, 896)),
                                                                 (340, (640, 1408)), (560, (768, 1664))]
    final = s.final_validation()
    assert final.window_blocks == (6, 20) and final.window_tokens == (768, 2560) and d["final_validation"] == {
        "window_blocks": [6, 20], "yarn_rescale": False}
    assert final.eval and final.canonical_mask and final.candidates is None
    # cut lengths 896 / 2048 / 3072, attention segments split at 2560 tokens from 340
    assert runs(values_by_step(s, lambda p: (p.cut_tokens, p.max_seq_len))) == [(0, (896, 896)), (160, (2048, 2048)),
                                                                               (340, (3072, 2560))]
    # sampled softmax: 10,240 to 339, 14,336 to 463, 24,576 to 525, full from 526
    assert runs(values_by_step(s, lambda p: p.candidates)) == [(0, 10240), (340, 14336), (464, 24576), (526, None)]
    # MTP: [1, 0.5, 0.25 -> 0] on 0-159, [1, 0.5 -> 0] on 160-339, then [1]
    assert s.plan(0).mtp_weights == (1.0, 0.5, 0.25)
    assert s.plan(80).mtp_weights == (1.0, 0.5, 0.125)
    assert s.plan(159).mtp_weights == pytest.approx((1.0, 0.5, 0.25 / 160))
    assert s.plan(160).mtp_weights == (1.0, 0.5) and s.plan(250).mtp_weights == (1.0, 0.25)
    assert s.plan(340).mtp_weights == (1.0,) and s.plan(569).mtp_weights == (1.0,)
    # prefix weight: 0.25 (0-159); 0.20 / 0.15 / 0.10 / 0.05 on 160-204 / 205-249 / 250-294 / 295-339; then 0
    assert runs(values_by_step(s, lambda p: p.prefix_weight)) == [(0, 0.25), (160, 0.20), (205, 0.15), (250, 0.10),
                                                                 (295, 0.05), (340, 0.0)]
    # s: 1 before 280; linear to 0.30 at 560; 0.30 on 560-569
    assert [s.lr_scale(t) for t in (0, 279, 280)] == [1.0, 1.0, 1.0]
    assert s.lr_scale(420) == pytest.approx(0.65) and s.lr_scale(559) == pytest.approx(0.3025)
    assert [s.lr_scale(t) for t in (560, 565, 569)] == [0.30, 0.30, 0.30]
    # rails: 0.85 -> 0.93 over 0-116, 0.93 to 546, toward 0.85 at 570 (0.8533 at 569); both rails from 245
    assert s.rail_beta(0) == 0.85 and s.rail_beta(58) == pytest.approx(0.89) and s.rail_beta(116) == 0.93
    assert s.rail_beta(546) == 0.93 and s.rail_beta(569) == pytest.approx(0.85 + 0.08 / 24)
    assert runs(values_by_step(s, lambda p: p.rails_engaged)) == [(0, False), (245, True)]
    # Adam on odd steps; the table: odd steps to 159, then 3 mod 4 from 163 to 567
    assert [t for t in range(570) if s.plan(t).adam_step] == list(range(1, 570, 2))
    assert [t for t in range(570) if s.plan(t).table_event] == list(range(1, 160, 2)) + list(range(163, 570, 4))
    # tied through step 561's update; the first untied one is 563
    assert s.untie_step == 561 and s.plan(561).tied and not s.plan(563).tied
    # the tail windows from 570 - 142 = 428 and 570 - 119 = 451; tail-avg rate (4/53) * 1194/570
    assert d["tail"] == {"total_steps": 570, "ema_window": 142, "avg_window": 119,
                         "avg_rate": pytest.approx(4 / 53 * 1194 / 570)}
    assert d["fp8_exact_refreshes"] == 16
    assert d["switches"] == {
        "rail_warmup_end": 116, "table_period4": 160, "stage_1": 160, "rail_engage": 245, "lr_cooldown_start": 280,
        "stage_2": 340, "candidates_14336": 340, "tail_ema_start": 428, "tail_avg_start": 451,
        "candidates_24576": 464, "stage_3": 526, "candidates_full": 526, "rail_cooldown_start": 546, "stage_4": 560,
        "untie_after": 561, "end": 570}


def test_every_length_passes_every_switch_in_order():
    record = RecordSchedule(570).switches()
    for n in range(MIN_STEPS, 571):
        got = RecordSchedule(n).switches()
        assert set(got) == set(record), n  # every switch happens (the candidate changes included)
        assert all(0 < step <= n for step in got.values()), (n, got)
        for a in record:
            for b in record:
                if record[a] < record[b]:
                    assert got[a] <= got[b], (n, a, got[a], b, got[b])
        starts = [got[f"stage_{i}"] for i in range(1, 5)]
        assert 0 < starts[0] < starts[1] < starts[2] < starts[3] < n, (n, starts)  # no stage empty
        assert got["untie_after"] % 2 == 1 and starts[3] <= got["untie_after"] < n  # an odd step of the extension


@pytest.mark.parametrize("n", [MIN_STEPS, 100, 103, 150, 285])
def test_a_short_run_shows_every_value(n):
    s = RecordSchedule(n)
    plans = [s.plan(t) for t in range(n)]
    assert {p.window_blocks for p in plans} == {(1, 3), (3, 7), (5, 11), (6, 13)}
    assert {p.cut_tokens for p in plans} == {896, 2048, 3072}
    assert {p.prefix_weight for p in plans} == {0.25, 0.20, 0.15, 0.10, 0.05, 0.0}
    assert {p.candidates for p in plans} == {10240, 14336, 24576, None}
    assert {len(p.mtp_weights) for p in plans} == {3, 2, 1}
    assert {p.rails_engaged for p in plans} == {False, True}
    assert max(p.rail_beta for p in plans) == 0.93 and plans[-1].rail_beta < 0.93
    assert plans[-1].lr_scale == 0.30 and plans[0].lr_scale == 1.0
    assert any(p.tied for p in plans) and not plans[-1].tied and plans[s.untie_step].adam_step
    events = [t for t in range(n) if plans[t].table_event]
    # odd steps before the (scaled) switch, steps = 3 mod 4 from it on (at 103 the switch, 29, is odd)
    assert events == [t for t in range(s.table_switch) if t % 2] + [t for t in range(s.table_switch, n) if t % 4 == 3]
    assert {b - a for a, b in zip(events, events[1:])} <= {2, 4} and 2 in {b - a for a, b in zip(events, events[1:])}
    assert events[-1] % 4 == 3
    # the scaled constants, rounded half up from n/570
    assert s.engage_step == max(1, int(245 * n / 570 + 0.5)) and s.rail_warmup == max(1, int(116 * n / 570 + 0.5))
    assert s.tail_ema_window == max(1, int(142 * n / 570 + 0.5)) and s.table_switch == max(1, int(160 * n / 570 + 0.5))


def test_too_short_and_out_of_range_are_named():
    with pytest.raises(ValueError, match=f"steps=83 is below {MIN_STEPS}"):
        RecordSchedule(83)
    with pytest.raises(ValueError, match="step 570 outside the run's 0..569"):
        RecordSchedule().plan(570)


def test_block_size_and_vocabulary_set_token_lengths_and_candidates():
    s = RecordSchedule(570, block_tokens=16, vocab=12000)
    assert s.plan(0).window_tokens == (16, 48) and s.plan(400).max_seq_len == 320 and s.plan(400).cut_tokens == 384
    # P at or above the vocabulary means the full softmax
    assert s.plan(0).candidates == 10240 and s.plan(400).candidates is None


def test_the_models_exact_fp8_refreshes_follow_the_schedule():
    """record_config hands the schedule's scaled count to the MLP's fp8 scales (16 at 570 steps, 2 at 84)."""
    from argparse import Namespace
    from model.record_gpt import RecordGPT
    from train.record_setup import record_config
    for steps, exact in ((570, 16), (84, 2)):
        args = Namespace(steps=steps, block_tokens=16, tokens_per_step=1024, vocab_size=50257, n_embd=64, n_head=2,
                         hint_repr="record", hint_lengths=(6, 10, 20), ngram_rows=4096, fp8="on")
        cfg = record_config(args)
        assert cfg.fp8_exact_refreshes == RecordSchedule(steps).fp8_exact_refreshes == exact
        with torch.device("meta"):
            assert RecordGPT(cfg).fp8_mlp_scales.exact_refreshes == exact
