"""Per-passage loss with hints and without, for a checkpoint and an index.

    python scripts/passages.py --checkpoint runs/demo/ckpt.pt --index runs/demo.idx --text-file some.txt

A passage is a paragraph of --text-file (blank-line separated; paragraphs under --min-tokens are
joined to the next), or with --passage-tokens N every N tokens of it (or of --token-file: .npy
ids or .bin shards). Each is scored on its own from its first token, up to the model's context:
the mean cross-entropy of its tokens after the first, with hints (train/evaluate.py's
val_hint_arrays, as validation computes them, over the passage) and without. Text the index
holds is where hints matter: the record's article reports 3.4-4.6 without hints and
0.03-0.19 with on famous passages.
"""
import argparse
import json
import sys


import numpy as np

from data.tokenizer import gpt2
from train.inference import InferenceError, load_model, open_index, passage_losses

MIN_TOKENS = 16  # shorter paragraphs join the next: a handful of tokens gives a noisy mean


def passages(args, enc):
    """[(token ids, a short label)] from the arguments."""
    if args.token_file:
        from hints.tokens import read_all
        toks = read_all(args.token_file).astype(np.int64)
        n = args.passage_tokens or 256
        return [(toks[i:i + n], f"tokens {i}-{i + n}") for i in range(0, toks.size - 1, n) if toks[i:i + n].size > 1]
    with open(args.text_file, encoding="utf-8") as f:
        text = f.read()
    if args.passage_tokens:
        toks = np.array(enc.encode(text, allowed_special="all"), dtype=np.int64)
        n = args.passage_tokens
        return [(toks[i:i + n], enc.decode(toks[i:i + n].tolist())) for i in range(0, toks.size - 1, n)
                if toks[i:i + n].size > 1]
    out, pending = [], ""
    for para in text.split("\n\n"):
        pending = f"{pending}\n\n{para}" if pending else para
        ids = enc.encode(pending, allowed_special="all")
        if len(ids) >= args.min_tokens:
            out.append((np.array(ids, dtype=np.int64), pending))
            pending = ""
    if pending.strip() and len(enc.encode(pending)) > 1:
        out.append((np.array(enc.encode(pending, allowed_special="all"), dtype=np.int64), pending))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--index", help="a saved hint index built with the model's lengths")
    p.add_argument("--hint-files", help="token shards to build the index from instead of --index")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--text-file", help="a text file; passages are its paragraphs")
    g.add_argument("--token-file", help="token ids (.npy or .bin shards) cut into --passage-tokens passages")
    p.add_argument("--passage-tokens", type=int, default=None, help="passages of this many tokens instead of paragraphs")
    p.add_argument("--min-tokens", type=int, default=MIN_TOKENS, help="paragraphs shorter than this join the next")
    p.add_argument("--max-passages", type=int, default=None)
    p.add_argument("--json", help="write the table here")
    args = p.parse_args(argv)
    if not (args.index or args.hint_files):
        p.error("give --index or --hint-files")
    try:
        model, lengths = load_model(args.checkpoint)
        index, _ = open_index(args.index, args.hint_files, lengths)
        enc = gpt2()
        items = passages(args, enc)[:args.max_passages]
        if not items:
            raise InferenceError(f"{args.text_file or args.token_file}: no passage of 2 tokens or more")
        rows = []
        for i, (ids, label) in enumerate(items):
            bad = ids[ids >= model.cfg.vocab_size]
            if bad.size:
                raise InferenceError(f"passage {i}: token id {int(bad[0])} is out of range for the model's vocabulary "
                                     f"of {model.cfg.vocab_size} ids")
            with_h, without = passage_losses(model, index, ids)
            rows.append(dict(passage=i, tokens=int(min(ids.size, model.cfg.max_seq_len + 1)), loss_hints=with_h,
                             loss_nohints=without, start=" ".join(label.split())[:60]))
    except (InferenceError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{'#':>3}  {'tokens':>6}  {'loss with hints':>15}  {'without':>8}  passage")
    for r in rows:
        print(f"{r['passage']:>3}  {r['tokens']:>6}  {r['loss_hints']:>15.3f}  {r['loss_nohints']:>8.3f}  {r['start']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(checkpoint=args.checkpoint, index=args.index or args.hint_files, passages=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
