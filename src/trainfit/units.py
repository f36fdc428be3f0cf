"""Units appear only when printing: everything inside trainfit is integer bytes, FLOPs and float seconds."""
import math

from .errors import SetupError

KiB, MiB, GiB, TiB = 1024, 1024**2, 1024**3, 1024**4


def next_pow2(n: int) -> int:
    """The smallest power of two >= n, for n >= 1 (triton.next_power_of_2, NCCL's nextPow2)."""
    return 1 << (n - 1).bit_length()


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


def fmt_energy(kwh: float) -> str:
    """Energy in the unit that keeps its digits: Wh, kWh, MWh or GWh (a short run's 0.75 kWh is not "0.0 MWh")."""
    for unit, size in (("GWh", 1e6), ("MWh", 1e3), ("kWh", 1.0)):
        if abs(kwh) >= size:
            return f"{kwh / size:,.1f} {unit}"
    return f"{kwh * 1e3:,.0f} Wh"


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


_COUNT_SUFFIXES = {"K": 1e3, "M": 1e6, "G": 1e9, "B": 1e9, "T": 1e12, "P": 1e15}


def parse_count(text: str, flag: str = "--tokens", unit: str = "tokens",
                examples: tuple[str, ...] = ("15T", "4M", "1e12")) -> float:
    """'4M' -> 4e6, '15T' -> 1.5e13, '1e12' -> 1e12: a positive, finite count of tokens (or of `unit`).

    Used for --tokens and --global-batch-tokens (and bytes: setup/parsers.py parse_byte_count); `flag` is the
    option named in the error (a one-line SetupError saying what is wrong, with valid `examples`) for a malformed,
    unknown-suffix, NaN, infinite, zero or negative count.
    """
    example = "e.g. " + ", ".join(f"{flag} {x}" for x in examples[:-1]) + f" or {flag} {examples[-1]}" \
        if len(examples) > 1 else f"e.g. {flag} {examples[0]}"
    t = str(text).strip().upper()
    body, mult = t, 1.0
    if t and t[-1] in _COUNT_SUFFIXES:
        body, mult = t[:-1].strip(), _COUNT_SUFFIXES[t[-1]]
    try:
        value = float(body) * mult
    except ValueError:
        head = t.rstrip("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
        unknown = t[len(head):]
        why = (f"unknown suffix {unknown!r} (use K, M, G or B, T, P)" if head and unknown and _is_number(head)
               else "not a number")
        raise SetupError(f"{flag} {text!r}: {why}; give a count like {example[5:]}") from None
    if math.isnan(value) or math.isinf(value):
        raise SetupError(f"{flag} {text!r} is not a finite count; give a positive number of {unit}, {example}")
    if value <= 0:
        raise SetupError(f"{flag} {text!r} must be a positive number of {unit}, {example}")
    return value


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
