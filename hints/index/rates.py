"""Recorded build rates: tokens per second per builder thread (one thread per physical core), by CPU class.

The record's plan (train/plan.py) estimates when the background index will be ready from the
rate recorded for the node's CPU class, else from the design floor. `python -m hints bench
--save-rate` records this machine's rate (its end-to-end build from shards, one worker) under
its CPU model name in BUILD_RATES_FILE; every entry says where its number comes from.
"""
import json
import os

BUILD_RATES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build_rates.json")


def cpu_model(cpuinfo="/proc/cpuinfo"):
    """This machine's CPU model name ('Intel(R) Xeon(R) Platinum 8468'), or 'unknown'."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return " ".join(value.split())
    except OSError:
        pass
    return "unknown"


def load_rates(path=BUILD_RATES_FILE):
    """{cpu model: {"tokens_per_s_per_core": float, "source": str}}; {} when there is no file."""
    try:
        with open(path) as f:
            rates = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ValueError(f"build rates {path}: unreadable ({e})") from None
    for model, entry in rates.items():
        if not isinstance(entry, dict) or not float(entry.get("tokens_per_s_per_core", 0)) > 0 or "source" not in entry:
            raise ValueError(f"build rates {path}: entry {model!r} needs tokens_per_s_per_core > 0 and a source")
    return rates


def save_rate(model, rate, source, path=BUILD_RATES_FILE):
    """Record `rate` (tokens/s per core) for CPU `model`, replacing its entry; the file stays sorted."""
    rates = load_rates(path)
    rates[model] = dict(tokens_per_s_per_core=float(rate), source=source)
    with open(path, "w") as f:
        json.dump(dict(sorted(rates.items())), f, indent=1)
        f.write("\n")
    return rates[model]
