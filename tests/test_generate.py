"""Generation: the KV-cache forward equals the model's forward (both archs, every backbone
feature); greedy tokens with drafting (llama.cpp's rule and the hints policy) equal those without,
and seeded sampling's too, on a small checkpoint this module trains; bad input ends in one line;
scripts/passages.py scores passages with and without hints."""
import dataclasses
import json
import runpy
import sys

import numpy as np
import pytest
import torch

from hints import Geometry, HintIndex, n_kinds
from hints.draft import HintDrafter, LlamaDrafter
from model.gpt import GPT, RECORD_BACKBONE, GPTConfig
from model.kv_cache import KVCache, forward_cached
from train.evaluate import val_hint_arrays
from train.inference import Generator, InferenceError, load_model, open_index

pytestmark = pytest.mark.usefixtures("one_torch_thread")
VOCAB, LENGTHS = 512, (6, 10, 20)
REPO_SCRIPTS = __import__("pathlib").Path(__file__).resolve().parents[1] / "scripts"


@pytest.mark.parametrize("arch, extra", [("speedrun", {}), ("gpt2", {}),
                                         ("speedrun", dict(RECORD_BACKBONE, value_embeds=2, no_attn_layers=(2,),
                                                           attn_block_size=8))])
def test_kv_cache_forward_equals_the_full_forward(arch, extra):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=300, n_layer=4, n_head=2, n_embd=32, arch=arch, max_seq_len=64, n_hint_kinds=126,
                    **extra)
    m = GPT(cfg).eval()
    for p in m.parameters():  # zero-initialised projections would hide the attention path
        torch.nn.init.normal_(p, std=0.3)
    idx = torch.randint(0, 300, (1, 64))
    if cfg.window_attn:
        cfg.bos_id = int(idx[0, 10])  # a document boundary inside the sequence
        m.set_window_blocks(3)
    ht = torch.randint(-1, 300, (1, 64, 3))
    hk = torch.where(ht >= 0, torch.randint(0, 126, (1, 64, 3)), -1)
    with torch.no_grad():
        full = m(idx, None, ht, hk)
    cache = KVCache(m)
    parts = [forward_cached(m, idx[:, a:b], (ht[:, a:b], hk[:, a:b]), cache)
             for a, b in [(0, 5), (5, 6), (6, 20), (20, 21), (21, 64)]]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-4, rtol=1e-4)
    cache.truncate(20)  # a rejected run is forgotten: recomputing it gives the same logits
    torch.testing.assert_close(forward_cached(m, idx[:, 20:64], (ht[:, 20:64], hk[:, 20:64]), cache), full[:, 20:],
                               atol=1e-4, rtol=1e-4)


def phrase_text(n, seed):
    rng = np.random.default_rng(0)  # the phrases are shared by every seed
    phrases = [rng.integers(0, VOCAB, size=rng.integers(8, 30)) for _ in range(40)]
    rng = np.random.default_rng(seed)
    out = [phrases[i] for i in rng.integers(0, 40, n // 10)]
    return np.concatenate(out)[:n].astype(np.int64)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return train_small(tmp_path_factory.mktemp("gen"))


def train_small(tmp):
    """A small speedrun model trained with hints on phrase text, saved as train_gpt.py saves its
    main checkpoint file; and the index of that text."""
    torch.manual_seed(0)
    text = phrase_text(40_000, 1)
    index = HintIndex(Geometry(0, 10, 176, LENGTHS)).add(text.astype(np.uint16)).seal()
    index.save(str(tmp / "idx"))
    cfg = GPTConfig(vocab_size=VOCAB, n_layer=2, n_head=2, n_embd=64, max_seq_len=128, n_hint_kinds=n_kinds(3))
    model = GPT(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    T, B = 64, 8
    hints = val_hint_arrays(index, text.astype(np.uint16), 0, text.size)
    rng = np.random.default_rng(0)
    for _ in range(150):
        starts = rng.integers(0, text.size - T - 1, B)
        x = torch.from_numpy(np.stack([text[s:s + T] for s in starts]))
        y = torch.from_numpy(np.stack([text[s + 1:s + T + 1] for s in starts]))
        h = [torch.from_numpy(np.stack([a[s:s + T] for s in starts])) for a in hints]
        loss = model(x, y, *h)
        loss.backward()
        opt.step()
        opt.zero_grad()
    path = tmp / "ckpt.pt"
    torch.save(dict(format=2, step=150, model_config=dataclasses.asdict(cfg), model=model.state_dict(),
                    settings=dict(hint_lengths=list(LENGTHS))), path)
    return dict(path=str(path), index=str(tmp / "idx"), text=text, tmp=tmp)


def test_greedy_and_seeded_tokens_do_not_depend_on_drafting(trained):
    model, lengths = load_model(trained["path"])
    assert lengths == LENGTHS
    index, _ = open_index(trained["index"], None, lengths)
    text = phrase_text(200, 7)
    prompt = np.concatenate([text[:40], text[:10]])  # a repeat in the prompt: llama.cpp's context cache drafts it
    for hinted in (index, None):
        gen = Generator(model, hinted)
        plain = gen.generate(prompt, 60)
        assert plain["n_drafted"] == 0 and plain["n_forwards"] == 61  # prefill + one per token
        for drafter in (LlamaDrafter(), HintDrafter(index)):
            out = gen.generate(prompt, 60, drafter=drafter, n_draft=8)
            assert out["tokens"] == plain["tokens"]
            assert 0 < out["n_accept"] <= out["n_drafted"] and out["n_forwards"] < plain["n_forwards"]
        sampled = gen.generate(prompt, 40, temperature=0.8, top_k=50, seed=3)
        again = gen.generate(prompt, 40, temperature=0.8, top_k=50, seed=3, drafter=HintDrafter(index), n_draft=8)
        assert again["tokens"] == sampled["tokens"]  # one draw per emitted token, in order
        assert gen.generate(prompt, 40, temperature=0.8, top_k=50, seed=4)["tokens"] != sampled["tokens"]


def test_an_index_built_from_hint_files_gives_the_saved_ones_hints(trained):
    """--hint-files: the index is built (Geometry.for_tokens) and sealed from the shards."""
    from data.manifest import write_manifest
    from data.shards import write_shard
    folder = trained["tmp"] / "shards"
    folder.mkdir()
    write_shard(folder / "train_000000.bin", trained["text"].astype(np.uint16))
    write_manifest(folder)
    built, _ = open_index(None, str(folder / "train_*.bin"), LENGTHS)
    saved, _ = open_index(trained["index"], None, LENGTHS)
    q = phrase_text(3000, 9).astype(np.uint16)
    assert built.tokens_added == trained["text"].size and built.sealed
    a, b = val_hint_arrays(built, q, 0, q.size)[0], val_hint_arrays(saved, q, 0, q.size)[0]
    assert (a >= 0).sum() > q.size  # hints at most positions (phrase text the index holds)
    assert (a == b).mean() > 0.99   # the geometries differ (Geometry.for_tokens is smaller): a few drops


def test_generation_stops_at_the_context(trained):
    model, lengths = load_model(trained["path"])
    out = Generator(model).generate(phrase_text(200, 7)[:100], 64, drafter=LlamaDrafter(), n_draft=16)
    assert out["n_new"] == 28 and out["capped_at_context"]


def run_script(name, argv, capsys):
    old = sys.argv
    sys.argv = [name] + argv
    try:
        with pytest.raises(SystemExit) as e:
            runpy.run_path(str(REPO_SCRIPTS / name), run_name="__main__")
    finally:
        sys.argv = old
    cap = capsys.readouterr()
    return e.value.code, cap.out, cap.err


def test_generate_script_json_and_ledgers(trained, capsys):
    out = trained["tmp"] / "gen.json"
    ids = ",".join(str(t) for t in phrase_text(200, 7)[:30])
    code, stdout, _ = run_script("generate.py", ["--checkpoint", trained["path"], "--index", trained["index"],
                                                 "--prompt-ids", ids, "--max-new-tokens", "40", "--draft", "hints",
                                                 "--json", str(out)], capsys)
    assert code == 0
    res = json.loads(out.read_text())
    for key in ("tokens", "text", "n_drafted", "n_accept", "tokens_per_s", "draft_ms_per_token", "index_load_s"):
        assert key in res
    assert res["identical_to_without_drafting"] and len(res["tokens"]) == 40
    assert "end to end" in stdout and "greedy output with drafting == without drafting" in stdout


@pytest.mark.parametrize("argv, message", [
    (["--prompt-ids", ""], "--prompt: empty"),
    (["--prompt-ids", ",".join(["1"] * 128)], "the model's context is 128"),
    (["--prompt-ids", "1,2,600"], "token id 600 is out of range"),
    (["--prompt-ids", "1,x"], "expected comma-separated integers"),
])
def test_bad_prompts_end_in_one_line(trained, capsys, argv, message):
    code, _, err = run_script("generate.py", ["--checkpoint", trained["path"], "--index", trained["index"]] + argv,
                              capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_mismatched_index_and_unsafe_checkpoints_are_refused(trained, capsys):
    other = trained["tmp"] / "other.idx"
    HintIndex(Geometry(0, 4, 176, (5, 6, 10))).add(phrase_text(2000, 2).astype(np.uint16)).seal().save(str(other))
    code, _, err = run_script("generate.py", ["--checkpoint", trained["path"], "--index", str(other),
                                              "--prompt-ids", "1,2"], capsys)
    assert code == 2 and "built with n-gram lengths (5, 6, 10)" in err
    wide = trained["tmp"] / "wide.idx"  # hints ids the model's 512-token vocabulary does not have
    text = np.tile([1, 2, 3, 4, 5, 6, 7, 600], 30).astype(np.uint16)  # (2, ..., 7) is followed by 600
    HintIndex(Geometry(0, 4, 176, LENGTHS)).add(text).seal().save(str(wide))
    code, _, err = run_script("generate.py", ["--checkpoint", trained["path"], "--index", str(wide), "--prompt-ids",
                                              "1,2,3,4,5,6,7"], capsys)
    assert code == 2 and "outside the model's vocabulary of 512" in err

    class Evil:
        def __reduce__(self):
            return (print, ("executed",))
    bad = trained["tmp"] / "evil.pt"
    torch.save(dict(model_config={}, model=Evil()), bad)
    with pytest.raises(InferenceError, match="weights_only"):
        load_model(str(bad))


def test_passages_report(trained, capsys):
    text = trained["text"]
    np.save(trained["tmp"] / "passages.npy", text[:1000])
    out = trained["tmp"] / "p.json"
    code, stdout, _ = run_script("passages.py", ["--checkpoint", trained["path"], "--index", trained["index"],
                                                 "--token-file", str(trained["tmp"] / "passages.npy"),
                                                 "--passage-tokens", "100", "--json", str(out)], capsys)
    assert code == 0
    rows = json.loads(out.read_text())["passages"]
    assert len(rows) == 10
    # the passages are text the index holds: hints lower the loss of every one
    assert all(r["loss_hints"] < r["loss_nohints"] for r in rows)
    assert "loss with hints" in stdout
