"""Value-level checks and parsers of the free-form settings (--offload, --recompute, --lora-targets, --pp-split,
--alloc-conf): each raises one line naming the flag."""
from __future__ import annotations

from functools import lru_cache

from ..errors import SetupError
from .pp_layout import is_layout, parse as parse_layout
from .vocab import OFFLOAD, RECOMPUTE, RECOMPUTE_PATTERNS


def parse_shards(text) -> int:
    """--tiled-mlp: a shard count, or auto (0: the stack's own rule, analytic/long_context.py)."""
    if str(text).strip().lower() == "auto":
        return 0
    try:
        return int(text)
    except ValueError:
        raise ValueError("expected a number of shards or auto") from None


def combine_offload(text: str) -> str:
    """--offload given several times ("optimizer,params", or a value of OFFLOAD_VALUES such as "activations+params"):
    one of OFFLOAD_VALUES. DeepSpeed's offload_param comes with offload_optimizer in trainfit's model (ZeRO-Infinity,
    analytic/parallel/deepspeed.py), so that pair is `params`; the saved activations go to the host by their own
    mechanism (torchtune's OffloadActivations, ArcticTraining's checkpoint offload) beside either state offload:
    "activations+optimizer", "activations+params". Whether a stack runs each part: setup/rules.py."""
    if not text.strip(", +"):
        raise ValueError(f"choose from {', '.join(OFFLOAD)}")
    parts = {p.strip() for p in text.replace("+", ",").split(",") if p.strip()} - {"none"}
    unknown = parts - set(OFFLOAD)
    if unknown:
        raise ValueError(f"unknown {', '.join(sorted(unknown))}; choose from {', '.join(OFFLOAD)}")
    state = "params" if "params" in parts else "optimizer" if "optimizer" in parts else None
    value = "+".join(p for p in ("activations" if "activations" in parts else None, state) if p)
    return value or "none"


def _check_alloc_conf(text) -> None:
    from ..alloc.config import parse_alloc_conf

    parse_alloc_conf(text)  # a one-line SetupError on bad input


def check_recompute(v: str) -> None:
    if not isinstance(v, str):
        raise SetupError(f"--recompute must be text, got {v!r} (e.g. --recompute full)")
    name, _, n = v.partition(":")
    if name in RECOMPUTE_PATTERNS:
        if not n.isdigit() or int(n) < 1:
            raise SetupError(f"--recompute {v!r}: {name}:N needs a positive integer N (e.g. {name}:2)")
        return
    if v not in RECOMPUTE:
        raise SetupError(f"--recompute {v!r} is not supported; choose one of: {', '.join(RECOMPUTE)}, "
                         + ", ".join(p + ":N" for p in RECOMPUTE_PATTERNS))


# Megatron-Core's recompute modules (megatron/core/transformer/transformer_config.py:411-424; what each drops and
# re-runs: analytic/megatron_recompute.py)
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")


def _named(v: str, allowed: tuple[str, ...], flag: str, what: str, example: str) -> tuple[str, ...]:
    """The comma-separated names of `flag`'s value, each one of `allowed` and named once (one line otherwise)."""
    names = tuple(n.strip() for n in v.split(",") if n.strip())
    bad = [n for n in names if n not in allowed]
    if not names or bad:
        raise SetupError(f"{flag} {v!r}: {', '.join(bad) or f'no {what} named'} is not a {what}; choose from "
                         f"{', '.join(allowed)} (comma-separated, e.g. {example})")
    if len(set(names)) != len(names):
        raise SetupError(f"{flag} {v!r} names a {what} twice; name each once")
    return names


@lru_cache(maxsize=256)  # (a str -> a tuple; the planner and the Megatron engine parse the same few values per call)
def parse_recompute_modules(v: str) -> tuple[str, ...]:
    """The module names of --recompute-modules ("layernorm,moe_act"), checked against RECOMPUTE_MODULES."""
    return _named(v, RECOMPUTE_MODULES, "--recompute-modules", "Megatron recompute module", "layernorm,moe_act")


def check_recompute_modules(v: str) -> None:
    if not isinstance(v, str):
        raise SetupError(f"--recompute-modules must be text, got {v!r} (e.g. --recompute-modules layernorm,moe_act)")
    parse_recompute_modules(v)


# Megatron-Core's Transformer Engine CUDA graph scopes modelled (transformer_config.py:784-791 cuda_graph_scope with
# cuda_graph_impl "transformer_engine"; transformer_layer.py:942-965 the submodules each graphs)
CUDA_GRAPH_SCOPES = ("attn", "moe_router", "moe_preprocess")


def parse_cuda_graph_scope(v: str) -> tuple[str, ...]:
    """The scopes of --cuda-graph-scope ("moe_router,moe_preprocess"), checked against CUDA_GRAPH_SCOPES and
    Megatron's own rule (transformer_config.py:1747-1750: moe_preprocess only with moe_router)."""
    names = _named(v, CUDA_GRAPH_SCOPES, "--cuda-graph-scope", "modelled CUDA graph scope", "moe_router,moe_preprocess")
    if "moe_preprocess" in names and "moe_router" not in names:
        raise SetupError(f"--cuda-graph-scope {v!r}: Megatron graphs moe_preprocess only with moe_router "
                         "(transformer_config.py:1747-1750); add moe_router")
    return names


def check_cuda_graph_scope(v: str) -> None:
    if not isinstance(v, str):
        raise SetupError(f"--cuda-graph-scope must be text, got {v!r} (e.g. --cuda-graph-scope "
                         "moe_router,moe_preprocess)")
    parse_cuda_graph_scope(v)


def check_lora_targets(v: str) -> None:
    """all-linear, attention, or comma-separated module names (checked against the model where it is built)."""
    if not isinstance(v, str):
        raise SetupError(f"--lora-targets must be text, got {v!r} (e.g. --lora-targets q_proj,v_proj)")
    names = [n.strip() for n in v.split(",")]
    if v in ("all-linear", "attention"):
        return
    if not all(n.isidentifier() for n in names):
        raise SetupError(f"--lora-targets {v!r}: use all-linear, attention, or comma-separated module names "
                         "(e.g. q_proj,v_proj)")


def lora_target_names(v: str) -> tuple[str, ...]:
    """The explicit module names of --lora-targets (empty for all-linear / attention)."""
    return () if v in ("all-linear", "attention") else tuple(n.strip() for n in v.split(","))


@lru_cache(maxsize=1024)  # (the engines read it for every stage of every setup; each answer is immutable)
def parse_pp_split(v: str):
    """"even", "embedding-loss", (first, last) layer counts of "first:N,last:M" (either part may be left out:
    then -1, meaning the even share), or a pp_layout.Layout of Megatron's layout string ("Et*3|(tt|)*29,m|L")."""
    if v in ("even", "embedding-loss"):
        return v
    if is_layout(v):
        return parse_layout(v)
    first = last = -1
    for part in v.split(","):
        key, _, n = part.strip().partition(":")
        if key not in ("first", "last") or not n.isdigit() or int(n) < 1:
            raise SetupError(f"--pp-split {v!r}: use even, embedding-loss, first:N,last:M with positive layer "
                             "counts (e.g. first:7,last:7), or a Megatron layout string (e.g. Et*3|(tt|)*29,m|L)")
        if key == "first":
            first = int(n)
        else:
            last = int(n)
    return first, last


def check_pp_split(v: str) -> None:
    if not isinstance(v, str):
        raise SetupError(f"--pp-split must be text, got {v!r} (e.g. --pp-split embedding-loss)")
    parse_pp_split(v)


def parse_byte_count(text, flag: str = "--kv-cache-memory") -> int:
    """A whole number of bytes, with the K, M, G, T suffixes of 1000 (units.parse_count): '40G' -> 40e9."""
    from ..units import parse_count

    value = parse_count(text, flag, "bytes", ("40G", "4e10"))
    if value != int(value):
        raise SetupError(f"{flag} {text!r} is not a whole number of bytes; e.g. {flag} 40G")
    return int(value)
