"""Units appear only when printing: everything inside trainfit is integer bytes, FLOPs and float seconds."""

KiB, MiB, GiB, TiB = 1024, 1024**2, 1024**3, 1024**4


def fmt_bytes(n: float) -> str:
    """Binary units, as nvidia-smi and torch.cuda report them."""
    n = float(n)
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def fmt_count(n: float, suffix: str = "") -> str:
    """Decimal SI prefixes for counts (parameters, FLOPs, tokens)."""
    n = float(n)
    for unit, size in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}{suffix}"
    return f"{n:.0f} {suffix}".rstrip()


def fmt_seconds(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    if s < 120:
        return f"{s:.2f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 2 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def parse_count(text: str) -> float:
    """'4M' -> 4e6, '15T' -> 1.5e13, '1e12' -> 1e12. Used for --tokens and --global-batch-tokens."""
    t = text.strip().upper()
    mult = {"K": 1e3, "M": 1e6, "G": 1e9, "B": 1e9, "T": 1e12, "P": 1e15}
    if t and t[-1] in mult:
        return float(t[:-1]) * mult[t[-1]]
    return float(t)
