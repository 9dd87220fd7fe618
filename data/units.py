"""Token counts as people write them: `parse_token_count('1.2B')` and `human_tokens(1_200_000_000)`.

Every flag and report that takes or prints a token count (the trainer, the hint CLI, scaling and
ablation tables) goes through these two functions.
"""

_MULTIPLIERS = {"K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}


def parse_token_count(text):
    """'75M', '1.2B', '37B', '4096', '12_500' or 1.2e9 -> an int token count (>= 0)."""
    if isinstance(text, (int, float)):
        n = int(text)
    else:
        s = str(text).strip().upper().replace("_", "").replace(",", "")
        mult = _MULTIPLIERS.get(s[-1:], 1)
        try:
            n = int(float(s[:-1] if mult > 1 else s) * mult)
        except ValueError:
            raise ValueError(f"token count {text!r}: expected a number like 75M, 1.2B or 37B") from None
    if n < 0:
        raise ValueError(f"token count {text!r}: expected a count >= 0")
    return n


def human_tokens(n):
    """1_200_000_000 -> '1.2B', 75_000_000 -> '75M', 12_500 -> '12.5k', 384 -> '384' (3 significant digits)."""
    for unit, v in (("B", 10**9), ("M", 10**6), ("k", 10**3)):
        if abs(n) >= v:
            return f"{n / v:.3g}{unit}"
    return f"{n:.0f}"
