"""A prose corpus every Debian machine has offline: the Linux man-pages project as text.

Source: the pages of the Debian packages `manpages` and `manpages-dev` (the Linux
man-pages project: system calls, C library, files, overviews; 6.03 on Debian 12), found
with `dpkg-query -L`. Each page's troff source is turned into plain English text (macro
lines keep their words, font and spacing escapes go, comments and `.so` alias pages are
dropped) and written as one `.txt` file per page; `data.local_corpus.build_local_corpus`
then tokenizes those files into train/val shards, split by file as for the stdlib corpus.
`python -m hints bench --corpus prose` uses it next to the standard-library source corpus.
"""
import argparse
import gzip
import os
import re
import subprocess
import sys

from data.local_corpus import DEFAULT_OUT_DIR as LOCAL_OUT_DIR
from data.local_corpus import build_local_corpus

PACKAGES = ("manpages", "manpages-dev")  # Debian's packaging of the Linux man-pages project
DEFAULT_OUT_DIR = os.path.join(LOCAL_OUT_DIR, "man-pages")  # beside the stdlib corpus (git-ignored with it)
TEXT_SUBDIR = "text"
# Macros whose arguments are words of the text (font changes, headings, paragraph tags).
TEXT_MACROS = {"B", "I", "SM", "SB", "SH", "SS", "TP", "IP", "UR", "MT", "TQ"}
ALTERNATING_MACROS = {"BR", "RB", "IR", "RI", "BI", "IB"}  # fonts alternate between words written together
ESCAPES = [  # (pattern, replacement) for troff escapes inside text
    (re.compile(r"\\f(\[[^\]]*\]|\(..|.)"), ""),         # font changes
    (re.compile(r"\\s[+-]?\d+"), ""),                     # size changes
    (re.compile(r"\\\*(\[[^\]]*\]|\(..|.)"), ""),        # strings
    (re.compile(r"\\\((em|en)"), "-"),
    (re.compile(r"\\\((aq|cq|oq)"), "'"),
    (re.compile(r"\\\((lq|rq|dq)"), '"'),
    (re.compile(r"\\\(bu"), "*"),
    (re.compile(r"\\\(..|\\\[[^\]]*\]"), ""),            # other special characters
    (re.compile(r"\\[-]"), "-"),
    (re.compile(r"\\e"), "\\\\"),
    (re.compile(r"\\[ ~0]"), " "),
    (re.compile(r"\\[&,/%:|^)]"), ""),
    (re.compile(r"\\(.)"), r"\1"),
]


def man_page_files(packages=PACKAGES):
    """Sorted paths of the (gzipped, non-alias) man pages the packages install."""
    try:
        out = subprocess.run(["dpkg-query", "-L", *packages], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise FileNotFoundError(f"prose corpus: cannot list the files of Debian packages {', '.join(packages)} "
                                f"with dpkg-query ({e}); install them (apt-get install {' '.join(packages)}) "
                                f"or give the bench another corpus with --tokens") from None
    files = [p for p in out.splitlines() if re.search(r"/man/man\d/[^/]+\.gz$", p) and os.path.isfile(p)
             and not os.path.islink(p)]
    return sorted(files)


def troff_to_text(src):
    """Plain text of a man page's troff source ('' for an alias page that only sources another)."""
    lines = []
    for line in src.splitlines():
        if line.startswith((".\\\"", "'\\\"", ".\\}")):
            continue
        if line.startswith((".", "'")):
            parts = line[1:].split(None, 1)
            if not parts:
                continue
            if parts[0] == "so":
                return ""
            macro = parts[0]
            if macro not in TEXT_MACROS | ALTERNATING_MACROS or len(parts) == 1:
                continue
            words = [w.strip('"') for w in re.findall(r'"[^"]*"|\S+', parts[1])]
            line = ("" if macro in ALTERNATING_MACROS else " ").join(words)
        for pattern, repl in ESCAPES:
            line = pattern.sub(repl, line)
        lines.append(line)
    return "\n".join(lines).strip() + "\n"


def extract_text(out_dir, packages=PACKAGES):
    """Write one .txt file per man page under out_dir/text/; returns that directory."""
    text_dir = os.path.join(out_dir, TEXT_SUBDIR)
    for path in man_page_files(packages):
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
            text = troff_to_text(f.read())
        if not text.strip():
            continue
        section, name = path.split("/")[-2:]
        dest = os.path.join(text_dir, section, name[:-len(".gz")] + ".txt")
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        old = None
        if os.path.exists(dest):  # rewrite only what changed: build_local_corpus fingerprints mtimes
            with open(dest, encoding="utf-8") as f:
                old = f.read()
        if old != text:
            with open(dest, "w", encoding="utf-8") as f:
                f.write(text)
    return text_dir


def build_prose_corpus(out_dir=DEFAULT_OUT_DIR, max_train_tokens=None, progress=True):
    """Tokenized train/val shards of the man-pages text (build_local_corpus's summary dict)."""
    text_dir = extract_text(out_dir)
    return build_local_corpus(src_dir=text_dir, out_dir=out_dir, pattern="*.txt",
                              max_train_tokens=max_train_tokens, progress=progress)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Build the man-pages prose corpus (GPT-2 train/val shards).")
    ap.add_argument("--out-dir", default=DEFAULT_OUT_DIR, help="output directory (default: %(default)s)")
    ap.add_argument("--max-train-tokens", type=int, default=None, help="cap on train tokens (default: no cap)")
    args = ap.parse_args(argv)
    try:
        build_prose_corpus(args.out_dir, args.max_train_tokens)
    except (ValueError, OSError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
