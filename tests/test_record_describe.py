"""train_gpt.py --describe: the run's model card and recipe as JSON, from the flags alone (no data, no
GPU, no download: the record preset's FineWeb shards are not on a CPU box, and it still describes)."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO))
CARD_KEYS = {"arch", "n_layer", "model_dim", "n_head", "head_dim", "vocab_size", "attention_layers", "mlp_layers",
             "mlp_hidden", "value_embed_layers", "ngram_table_rows", "steps", "tokens_per_step", "window_schedule",
             "params", "hint_inject", "stages", "switches"}


def describe(*flags):
    p = subprocess.run([sys.executable, str(REPO / "train_gpt.py"), *flags, "--describe"], cwd=REPO, env=ENV,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


def test_record_preset_describes_the_records_model_and_recipe():
    card = describe("--preset", "record")
    assert CARD_KEYS <= set(card)
    assert card["arch"] == "record" and card["n_layer"] == 11 and card["model_dim"] == 512 and card["n_head"] == 4
    assert card["vocab_size"] == 50304 and card["ngram_table_rows"] == 84_602_880 and card["mlp_hidden"] == 1792
    assert card["steps"] == 570 and card["tokens_per_step"] == 131_072 and card["tokens_per_rank"] == 16_384
    assert [st["first_step"] for st in card["stages"]] == [0, 160, 340, 526, 560]  # RECORD.md section 10
    assert card["window_schedule"] == [[0, 1, 3], [160, 3, 7], [340, 5, 11], [560, 6, 13]]  # section 3
    assert card["switches"]["rail_engage"] == 245 and card["switches"]["untie_after"] == 561
    assert card["stages"][2]["candidates"] == [14336, 14336, 24576] and card["stages"][3]["candidates"] is None
    assert card["params"]["total"] == sum(v for k, v in card["params"].items() if k != "total")
    assert card["canonical_mask"] and card["val_tokens"] == 10_485_760 and card["fp8"] is True
    memory = card["memory_per_gpu"]  # between steps, activations aside
    assert memory["ngram_table"] == 11_593_248_768  # model/ngram_table.py: 10.83 GB of rows, 11.59 GB in all
    assert memory["weights"] == memory["gradients"] < 2 * card["params"]["total"] + 4 * 10 ** 6  # bf16, a few fp32
    # ANVIL per rank of 8 (RECORD.md section 2's banks qk [32, 256, 512], vo [16, 512, 512], mlp [12, 2, 1792, 512]):
    # owned units x (two fp32 rails + a uint16 mantissa per weight + an fp32 energy per lane of the longer side)
    assert memory["anvil_state"] == (4 * (256 * 512 * 10 + 512 * 4) + 2 * (512 * 512 * 10 + 512 * 4)
                                     + 3 * (1792 * 512 * 10 + 1792 * 4))
    assert memory["total"] == sum(v for k, v in memory.items() if k not in ("total", "h100_share"))
    assert 0.1 < memory["h100_share"] < 0.25  # the record's state fits an 80 GB H100 with room for activations


def test_steps_scale_the_recipe_and_other_archs_describe_too():
    card = describe("--preset", "record", "--steps", "285")
    assert card["steps"] == 285 and [st["first_step"] for st in card["stages"]] == [0, 80, 170, 263, 280]
    demo = describe("--preset", "demo")
    assert demo["arch"] == "record" and demo["steps"] == 84 and demo["model_dim"] == 128
    old = describe("--preset", "demo-2025")
    assert old["arch"] == "speedrun" and old["steps"] == 300 and old["params"]["total"] > 0


def test_fp8_is_the_records_and_off_in_the_cpu_demo_unless_asked():
    assert describe("--preset", "demo")["fp8"] is False
    assert describe("--preset", "demo", "--fp8", "on")["fp8"] is True
    assert describe("--preset", "record", "--fp8", "off")["fp8"] is False


def test_the_record_arch_refuses_the_lengths_representation_by_name():
    p = subprocess.run([sys.executable, str(REPO / "train_gpt.py"), "--preset", "demo", "--hint-repr", "lengths",
                        "--describe"], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "--hint-repr" in p.stderr and "'lengths'" in p.stderr
