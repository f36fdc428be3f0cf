"""HF config.json (a plain dict) -> ModelSpec. Standard library only: no torch, no transformers.

Each supported `model_type` has a small builder that reads the keys that HF transformers' own
`Configuration*` / `modeling_*` classes read, with the same defaults (transformers 4.45 .. 5.x), so
that `trainfit.analytic.params.count_params(spec).total` equals the numel() of the transformers
model built from the same config (tests/models/test_params_exact.py checks every catalog model).

Defaults that differ by model type and change parameter counts (checked against
transformers/models/*/configuration_*.py):
- tie_word_embeddings: True for gpt2, opt, bert, roberta, gemma, gemma2, gemma3_text; False for the rest.
- head_dim: qwen3 defaults to 128 and gemma/gemma2/gemma3_text to 256 (NOT hidden/heads); others hidden/heads.
- biases: qwen2/qwen2_moe always have q/k/v bias (qwen2_moe: `qkv_bias`, default True);
  llama/qwen3/gemma use `attention_bias` on q,k,v,o; gpt_neox `attention_bias` (default True) on
  qkv+dense with biased MLP; gpt2/bert/roberta bias everything; opt `enable_bias` (default True).
"""
from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable

from trainfit import heads
from trainfit.errors import ConfigError, SetupError
from trainfit.spec import EncoderDecoderSpec, GatedDeltaNetSpec, HybridSpec, MLASpec, ModelSpec, MoESpec

if TYPE_CHECKING:  # pragma: no cover
    from trainfit.setup import Setup

_MISSING = object()

# No architecture size comes near this (vocabularies ~2**18, widths ~2**16, contexts ~2**24); a bigger value is
# a broken config, and would overflow the float arithmetic of the estimates.
MAX_SIZE = 2**40


class _NonFinite(ValueError):
    pass


def rope_parameters(config: dict) -> tuple[float, str | None, dict]:
    """(rope_theta, the scaling's type, the scaling dict) as a HF config holds them (transformers 4.x: rope_theta
    and rope_scaling, its type under "rope_type" or the older "type"; 5.x: rope_parameters holding both); theta
    10000 where none is given (transformers' default)."""
    key = "rope_scaling" if config.get("rope_scaling") else "rope_parameters"
    raw = config.get(key) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"'{key}' must be an object (e.g. {{\"rope_type\": \"llama3\", \"factor\": 8.0}}), got "
                          f"{str(raw)[:40]!r}")
    scaling = dict(raw)
    for name in ("rope_theta", "factor", "original_max_position_embeddings", "attention_factor"):
        v = scaling.get(name, config.get(name) if name == "rope_theta" else None)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise ConfigError(f"'{name}' of the rotary embedding must be a number, got {str(v)[:40]!r}")
    theta = float(scaling.get("rope_theta", config.get("rope_theta", 10000.0)))
    return theta, scaling.get("rope_type", scaling.get("type")), scaling


def yarn_attention_factor(config: dict) -> float:
    """YaRN's attention (concentration) factor, which scales cos and sin: 0.1·ln(factor) + 1, or the ratio of the two
    mscale forms where mscale and mscale_all_dim are both given (DeepSeek's); 1.0 without YaRN or at factor <= 1
    (transformers 5.24 modeling_rope_utils.py _compute_yarn_parameters get_mscale; megatron-core 0.16.1
    models/common/embeddings/yarn_rotary_pos_embedding.py:252-271 _yarn_get_mscale / _yarn_get_concentration_factor,
    the same formula). NB: an explicit attention_factor in the config is taken as given."""
    _, kind, scaling = rope_parameters(config)
    if kind != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = float(scaling.get("factor", 1.0))

    def mscale(m: float = 1.0) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0
    m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    return mscale() if m is None or m_all is None else mscale(float(m)) / mscale(float(m_all))


def _no_constant(token: str):
    raise _NonFinite(token)


def _finite_float(token: str) -> float:
    v = float(token)
    if not math.isfinite(v):
        raise _NonFinite(token)
    return v


def loads_config(data: bytes | str, where: str) -> dict:
    """A config.json's bytes (or text) -> its JSON object, or a one-line ConfigError naming `where` that says
    what is wrong: not UTF-8 (binary, UTF-16, Latin-1), not JSON, NaN/Infinity (Python's json accepts them;
    JSON does not), numbers out of range, nesting too deep, or not an object."""
    if isinstance(data, bytes):
        if data.startswith((b"\xff\xfe", b"\xfe\xff")):
            raise ConfigError(f"{where} is UTF-16 text; save it as UTF-8 (as HF writes config.json)")
        if b"\x00" in data[:4096]:
            raise ConfigError(f"{where} is a binary file, not JSON text; pass the model's config.json")
        try:
            data = data.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise ConfigError(f"{where} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                              "save it as UTF-8 JSON") from None
    if not data.strip():
        raise ConfigError(f"{where} is empty; a config.json is a JSON object with the model's architecture")
    try:
        config = json.loads(data, parse_constant=_no_constant, parse_float=_finite_float)
    except _NonFinite as e:
        raise ConfigError(f"{where} holds {e}, which is not a finite number (nor valid JSON); "
                          "replace it with a number or null") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except RecursionError:
        raise ConfigError(f"{where} is nested too deeply to be a config.json") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{where} must hold a JSON object (the model's architecture), not a JSON "
                          f"{_json_type(config)}")
    return config


def _json_type(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), "number")


def _check_finite(config: dict, name: str) -> None:
    """Refuse NaN and infinities anywhere in a config dict (a pasted config parsed by a lenient JSON reader)."""
    stack: list[tuple[str, Any]] = [("", config)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{name}: '{path}' is {v}, not a finite number; replace it with a number or null")
        if isinstance(v, dict):
            stack.extend((f"{path}.{k}" if path else str(k), x) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((f"{path}[{i}]", x) for i, x in enumerate(v))


class _Cfg:
    """A config dict with helpers that raise one-line ConfigErrors."""

    def __init__(self, config: dict, name: str, model_type: str):
        self.d = config
        self.name = name
        self.mt = model_type

    def has(self, key: str) -> bool:
        return self.d.get(key) is not None

    def get(self, *keys: str, default: Any = _MISSING) -> Any:
        for k in keys:
            v = self.d.get(k)
            if v is not None:
                return v
        if default is _MISSING:
            alts = " or ".join(f"'{k}'" for k in keys)
            raise ConfigError(
                f"{self.name}: config.json (model_type '{self.mt}') has no {alts}; "
                "pass a complete HF config.json"
            )
        return default

    def int(self, *keys: str, default: Any = _MISSING, minimum: int = 1) -> int:
        v = self.get(*keys, default=default)
        if (isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v))
                or int(v) != v):
            raise ConfigError(f"{self.name}: '{keys[0]}' must be an integer, got {v!r}")
        v = int(v)
        if v < minimum:
            raise ConfigError(f"{self.name}: '{keys[0]}' must be >= {minimum}, got {v}")
        if v > MAX_SIZE:
            shown = str(v) if len(str(v)) <= 20 else f"a {len(str(v))}-digit number"
            raise ConfigError(f"{self.name}: '{keys[0]}' is {shown}, beyond any real model (at most 2**40); "
                              "check the config")
        return v

    def bool(self, *keys: str, default: Any = _MISSING) -> bool:
        v = self.get(*keys, default=default)
        if not isinstance(v, bool):
            raise ConfigError(f"{self.name}: '{keys[0]}' must be true or false, got {v!r}")
        return v

    def float(self, *keys: str, default: Any = _MISSING) -> float:
        v = self.get(*keys, default=default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ConfigError(f"{self.name}: '{keys[0]}' must be a positive number, got {v!r}")
        return float(v)

    def str(self, *keys: str, default: Any = _MISSING) -> str:
        v = self.get(*keys, default=default)
        if not isinstance(v, str):
            raise ConfigError(f"{self.name}: '{keys[0]}' must be a string, got {v!r}")
        return v

    def dtype(self) -> str:
        v = self.d.get("torch_dtype") or self.d.get("dtype") or ""
        return v if isinstance(v, str) else ""

    def fail(self, what: str) -> ConfigError:
        return ConfigError(f"{self.name}: {what}")


def _heads(c: _Cfg, hidden: int, heads: int, *, head_dim_default: int | None = None,
           kv_default: int | None = None) -> tuple[int, int]:
    """(kv_heads, head_dim). num_key_value_heads: explicit key, else (key absent) the config class's
    default, else (null) heads. head_dim: explicit key, else the model type's default, else hidden/heads."""
    if "num_key_value_heads" not in c.d and kv_default is not None:
        kv = kv_default
    else:
        kv = c.int("num_key_value_heads", default=heads)
    if heads % kv:
        why = "" if "num_key_value_heads" in c.d else f", the {c.mt} default when the key is absent"
        raise c.fail(f"num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv}{why})")
    if c.has("head_dim"):
        hd = c.int("head_dim")
    elif head_dim_default is not None:
        hd = head_dim_default
    else:
        if hidden % heads:
            raise c.fail(
                f"hidden size {hidden} is not divisible by num_attention_heads {heads} "
                "and the config gives no head_dim"
            )
        hd = hidden // heads
    return kv, hd


def _sliding_layers(c: _Cfg, layers: int) -> int | None:
    """How many layers use the local window, from `layer_types` (transformers >= 4.53) when given."""
    lt = c.d.get("layer_types")
    if isinstance(lt, list) and lt:
        n = sum(1 for t in lt if t == "sliding_attention")
        return None if n == len(lt) else n
    return None


def _sliding_lead(c: _Cfg, default: int) -> int:
    """Sliding layers before the first full-attention one (where the decode step's cache peaks: analytic/inference.py
    _decode_cache_moment): the leading run of "sliding_attention" in `layer_types` when given, else the family
    config's pattern (`default`)."""
    lt = c.d.get("layer_types")
    if isinstance(lt, list) and lt:
        return next((i for i, t in enumerate(lt) if t != "sliding_attention"), len(lt))
    return default


def _rope_decoder(c: _Cfg, *, tie_default: bool, head_dim_default: int | None = None,
                  kv_default: int | None = None, act_keys: tuple[str, ...] = ("hidden_act",), act_default: str = "silu") -> dict:
    """Llama-style decoder: RMSNorm, rotary positions, gated MLP (HF modeling_llama and descendants)."""
    hidden = c.int("hidden_size")
    heads = c.int("num_attention_heads")
    kv, hd = _heads(c, hidden, heads, head_dim_default=head_dim_default, kv_default=kv_default)
    return dict(
        causal=True,
        hidden=hidden,
        layers=c.int("num_hidden_layers"),
        heads=heads,
        kv_heads=kv,
        head_dim=hd,
        intermediate=c.int("intermediate_size"),
        vocab=c.int("vocab_size"),
        max_positions=c.int("max_position_embeddings"),
        gated_mlp=True,
        activation=c.str(*act_keys, default=act_default),
        norm="rmsnorm",
        norm_bias=False,
        positions="rotary",
        tied_embeddings=c.bool("tie_word_embeddings", default=tie_default),
        dtype=c.dtype(),
    )


def _window(c: _Cfg) -> int | None:
    w = c.d.get("sliding_window")
    if w is None:
        return None
    return c.int("sliding_window")


# ---- per model_type builders ---------------------------------------------------------------


def _llama(c: _Cfg) -> dict:
    f = _rope_decoder(c, tie_default=False)
    ab = c.bool("attention_bias", default=False)  # HF modeling_llama: q/k/v/o bias=config.attention_bias
    f.update(qkv_bias=ab, out_bias=ab, mlp_bias=c.bool("mlp_bias", default=False))
    return f


def _mistral(c: _Cfg) -> dict:
    f = _rope_decoder(c, tie_default=False, kv_default=8)  # HF modeling_mistral: no biases anywhere
    f.update(sliding_window=_window(c))
    return f


def _qwen2(c: _Cfg, kv_default: int = 32) -> dict:
    f = _rope_decoder(c, tie_default=False, kv_default=kv_default)
    f.update(qkv_bias=True)  # HF modeling_qwen2: q/k/v bias=True, o_proj bias=False
    if c.bool("use_sliding_window", default=False):
        # Qwen2Config.layer_types: layer i is sliding when i >= max_window_layers
        n = f["layers"] - c.int("max_window_layers", default=28, minimum=0)
        if n > 0:
            f["sliding_window"] = _window(c)
            f["sliding_window_layers"] = n if n < f["layers"] else None
    return f


def _qwen3(c: _Cfg, kv_default: int = 32) -> dict:
    # Qwen3Config: head_dim = 128, num_key_value_heads = 32 when absent
    f = _rope_decoder(c, tie_default=False, head_dim_default=128, kv_default=kv_default)
    ab = c.bool("attention_bias", default=False)
    f.update(qkv_bias=ab, out_bias=ab, qk_norm=True)  # HF modeling_qwen3: q_norm, k_norm over head_dim
    if c.bool("use_sliding_window", default=False):
        f["sliding_window"] = _window(c)
    return f


def _gemma(c: _Cfg, kv_default: int = 16) -> dict:
    # HF modeling_gemma: GeGLU MLP, RMSNorm (1 + w), embeddings scaled by sqrt(hidden), tied by default
    f = _rope_decoder(c, tie_default=True, head_dim_default=256, kv_default=kv_default,
                      act_keys=("hidden_activation", "hidden_act"), act_default="gelu_pytorch_tanh")
    ab = c.bool("attention_bias", default=False)
    f.update(qkv_bias=ab, out_bias=ab)
    return f


def _gemma2(c: _Cfg) -> dict:
    f = _gemma(c, kv_default=4)  # Gemma2Config.num_key_value_heads = 4
    # HF modeling_gemma2: input, post_attention, pre_feedforward, post_feedforward RMSNorms
    f["norms_per_layer"] = 4
    # tanh soft-capping of the scores and the logits (modeling_gemma2.py); a null key turns it off. Gemma2Config
    # defaults: final_logit_softcapping 30.0, attn_logit_softcapping 50.0 (configuration_gemma2.py:89-90)
    f["attn_softcap"] = float(c.d.get("attn_logit_softcapping", 50.0) or 0.0)
    f["final_softcap"] = float(c.d.get("final_logit_softcapping", 30.0) or 0.0)
    f["sliding_window"] = _window(c) if "sliding_window" in c.d else 4096  # Gemma2Config default
    if f["sliding_window"] is not None:
        n = _sliding_layers(c, f["layers"])
        # Gemma2Config: layer i is sliding when i is even -> ceil(layers / 2)
        f["sliding_window_layers"] = n if "layer_types" in c.d else math.ceil(f["layers"] / 2)
        f["sliding_lead"] = _sliding_lead(c, 1)  # layer 0 sliding, layer 1 full
    return f


def _gemma3_text(c: _Cfg) -> dict:
    """Gemma 3's language model (Gemma3ForCausalLM; the 4B-27B checkpoints' text_config). Gemma3TextConfig defaults
    (configuration_gemma3.py:73-97): num_key_value_heads 4, head_dim 256, sliding_window 4096, no soft-capping."""
    if c.bool("use_bidirectional_attention", default=False):
        raise c.fail("use_bidirectional_attention (an encoder, EmbeddingGemma) is not supported; "
                     "supported: the causal Gemma 3 language model")
    f = _gemma(c, kv_default=4)
    # modeling_gemma3.py Gemma3DecoderLayer: input, post_attention, pre_feedforward, post_feedforward RMSNorms
    # (:367-370); Gemma3Attention: q_norm, k_norm = Gemma3RMSNorm(head_dim) (:310-311)
    f.update(norms_per_layer=4, qk_norm=True)
    # Gemma 3 replaced soft-capping by the qk norms: both default to None (configuration_gemma3.py:95-96)
    f["attn_softcap"] = float(c.d.get("attn_logit_softcapping") or 0.0)
    f["final_softcap"] = float(c.d.get("final_logit_softcapping") or 0.0)
    f["sliding_window"] = _window(c) if "sliding_window" in c.d else 4096
    if f["sliding_window"] is not None:
        f["sliding_window_layers"] = _gemma3_sliding_layers(c, f["layers"])
        # the first full layer is pattern - 1 (configuration_gemma3.py:105-111)
        f["sliding_lead"] = _sliding_lead(c, c.int("sliding_window_pattern", default=6) - 1)
    return f


def _gemma3_sliding_layers(c: _Cfg, layers: int) -> int | None:
    """How many layers attend within the window: `layer_types` when given, else Gemma3TextConfig's pattern — layer i
    is sliding unless (i + 1) % sliding_window_pattern == 0, the pattern 6 when absent (configuration_gemma3.py:
    105-111): 5 local layers per global one. None: every layer."""
    if "layer_types" in c.d:
        return _sliding_layers(c, layers)
    pattern = c.int("sliding_window_pattern", default=6)
    n = layers - layers // pattern
    return None if n == layers else n


def _phi3(c: _Cfg) -> dict:
    # HF modeling_phi3: fused qkv_proj and gate_up_proj (same counts as separate), no biases
    f = _rope_decoder(c, tie_default=False)
    f.update(sliding_window=_window(c))
    return f


def _moe_layers(c: _Cfg, layers: int, num_experts: int) -> int:
    """HF modeling_qwen2_moe / qwen3_moe: layer i is MoE iff i not in mlp_only_layers and
    num_experts > 0 and (i + 1) % decoder_sparse_step == 0."""
    step = c.int("decoder_sparse_step", default=1)
    only = c.get("mlp_only_layers", default=[])
    if not isinstance(only, list):
        raise c.fail(f"'mlp_only_layers' must be a list of layer indices, got {only!r}")
    if num_experts <= 0:
        return 0
    # counted, not walked (a config of 10**9 layers): the layers (i + 1) % step == 0 less the listed ones among them
    return layers // step - sum(1 for i in _listed_layers(only) if 0 <= i < layers and (i + 1) % step == 0)


def _listed_layers(given: list) -> set[int]:
    """The layer indexes a config's list names, as transformers tests them (`layer_idx in config.mlp_only_layers`,
    `in config.moe_layers`: by ==, so 3.0 and True name layers 3 and 1)."""
    return {int(v) for v in given if isinstance(v, (int, float)) and v == int(v)}


def _mixtral(c: _Cfg) -> dict:
    f = _rope_decoder(c, tie_default=False, kv_default=8)
    f.update(sliding_window=_window(c))
    e = c.int("num_local_experts", "num_experts")
    k = c.int("num_experts_per_tok")
    if k > e:
        raise c.fail(f"num_experts_per_tok ({k}) exceeds num_local_experts ({e})")
    # HF modeling_mixtral: every layer is a sparse block; experts have intermediate_size width
    # MixtralTopKRouter always renormalises the top-k weights (modeling_mixtral.py)
    f["moe"] = MoESpec(num_experts=e, top_k=k, expert_intermediate=f["intermediate"], norm_topk=True)
    return f


def _qwen_moe(c: _Cfg, *, shared: bool) -> dict:
    # Qwen2MoeConfig.num_key_value_heads = 16, Qwen3MoeConfig = 4 (when absent)
    f = _qwen2(c, kv_default=16) if shared else _qwen3(c, kv_default=4)
    if shared:
        f["qkv_bias"] = c.bool("qkv_bias", default=True)  # Qwen2MoeConfig.qkv_bias
    else:
        f["head_dim"] = c.int("head_dim") if c.has("head_dim") else f["hidden"] // f["heads"]
        if not c.has("head_dim") and f["hidden"] % f["heads"]:
            raise c.fail(f"hidden size {f['hidden']} is not divisible by num_attention_heads {f['heads']}")
    e = c.int("num_experts", "num_local_experts", minimum=0)
    k = c.int("num_experts_per_tok")
    n_moe = _moe_layers(c, f["layers"], e)
    if n_moe == 0:
        return f  # no sparse layer: a dense model
    if k > e:
        raise c.fail(f"num_experts_per_tok ({k}) exceeds num_experts ({e})")
    f["moe"] = MoESpec(
        num_experts=e,
        top_k=k,
        expert_intermediate=c.int("moe_intermediate_size"),
        # HF Qwen2MoeSparseMoeBlock: shared_expert (gated MLP) + shared_expert_gate Linear(hidden, 1)
        shared_intermediate=c.int("shared_expert_intermediate_size", minimum=0) if shared else 0,
        shared_gate=shared,
        sparse_layers=None if n_moe == f["layers"] else n_moe,
        # Qwen2MoeConfig / Qwen3MoeConfig.norm_topk_prob = False (configuration_qwen2_moe.py:100, qwen3_moe.py:101)
        norm_topk=c.bool("norm_topk_prob", default=False),
    )
    return f


def _deepseek(c: _Cfg, *, v3: bool) -> dict:
    """DeepSeek-V2/V3 (HF modeling_deepseek_v2.py / modeling_deepseek_v3.py): MLA attention, dense MLP in the first
    `first_k_dense_replace` layers, then an MoE block of n_routed_experts (top num_experts_per_tok) plus an always-on
    shared MLP of moe_intermediate_size * n_shared_experts. MLA widths default as DeepseekV2Config/DeepseekV3Config.
    The MTP module (num_nextn_predict_layers) is not built by transformers (modeling_deepseek_v3.py
    `_keys_to_ignore_on_load_unexpected` skips the checkpoint's model.layers.61.*): params.mtp_params counts it
    apart."""
    hidden = c.int("hidden_size")
    heads = c.int("num_attention_heads")
    layers = c.int("num_hidden_layers")
    # q_lora_rank: null means a plain q_proj (V2-Lite); absent means the config class default 1536
    q_lora = 0 if "q_lora_rank" in c.d and c.d["q_lora_rank"] is None else c.int("q_lora_rank", default=1536)
    mla = MLASpec(
        q_lora_rank=q_lora,
        kv_lora_rank=c.int("kv_lora_rank", default=512),
        qk_nope_head_dim=c.int("qk_nope_head_dim", default=128),
        qk_rope_head_dim=c.int("qk_rope_head_dim", default=64),
        v_head_dim=c.int("v_head_dim", default=128),
    )
    ab = c.bool("attention_bias", default=False)
    f = dict(
        causal=True, hidden=hidden, layers=layers, heads=heads,
        # MLA rebuilds k and v for every head from the latent: no grouping; head_dim is the q/k width
        kv_heads=heads, head_dim=mla.qk_head_dim,
        intermediate=c.int("intermediate_size"), vocab=c.int("vocab_size"),
        max_positions=c.int("max_position_embeddings"), gated_mlp=True,
        activation=c.str("hidden_act", default="silu"), norm="rmsnorm", norm_bias=False, positions="rotary",
        tied_embeddings=c.bool("tie_word_embeddings", default=False),
        qkv_bias=ab, out_bias=ab,
        # DeepseekV2MLP: gate/up/down bias=config.mlp_bias (dense and shared experts); DeepseekV3MLP: none
        mlp_bias=False if v3 else c.bool("mlp_bias", default=False),
        dtype=c.dtype(), mla=mla,
    )
    e = c.int("n_routed_experts", "num_experts", "num_local_experts", default=256 if v3 else 64, minimum=0)
    dense = c.int("first_k_dense_replace", default=3 if v3 else 0, minimum=0)
    n_moe = max(layers - dense, 0) if e > 0 else 0  # DecoderLayer: MoE iff layer_idx >= first_k_dense_replace
    if n_moe == 0:
        return f
    k = c.int("num_experts_per_tok", default=8) if v3 else c.int("num_experts_per_tok")
    if k > e:
        raise c.fail(f"num_experts_per_tok ({k}) exceeds n_routed_experts ({e})")
    mi = c.int("moe_intermediate_size", default=2048 if v3 else 1407)
    f["moe"] = MoESpec(
        num_experts=e, top_k=k, expert_intermediate=mi,
        shared_intermediate=mi * c.int("n_shared_experts", default=1 if v3 else 2, minimum=0),
        sparse_layers=None if n_moe == layers else n_moe, first_dense=layers - n_moe,
        router_scoring="sigmoid" if v3 else "softmax",  # DeepseekV3TopkRouter: sigmoid; V2: softmax
        # V3: norm_topk_prob, default True (configuration_deepseek_v3.py:101); V2's router never renormalises
        # (DeepseekV2TopkRouter.forward, modeling_deepseek_v2.py:97-116: its config's norm_topk_prob is unused)
        norm_topk=c.bool("norm_topk_prob", default=True) if v3 else False,
        # DeepseekV2Config.topk_method = "greedy" (configuration_deepseek_v2.py:115); DeepseekV3TopkRouter always
        # selects as noaux_tc (sigmoid scores + e_score_correction_bias, group-limited; it has no such option)
        topk_method="noaux_tc" if v3 else c.str("topk_method", default="greedy"),
        # V3's routed top-k weights × routed_scaling_factor (configuration_deepseek_v3.py:91, default 2.5); V2 scales
        # them too, by its own routed_scaling_factor (configuration_deepseek_v2.py, default 1.0)
        routed_scaling=c.float("routed_scaling_factor", default=2.5 if v3 else 1.0),
    )
    # group-limited routing: V3's router always (modeling_deepseek_v3.py:128-143; n_group 8, topk_group 4 by default,
    # configuration_deepseek_v3.py:97-98), V2's under topk_method group_limited_greedy (modeling_deepseek_v2.py:
    # 104-106; no defaults, :107,114)
    if v3 or f["moe"].topk_method == "group_limited_greedy":
        groups = c.int("n_group", default=8 if v3 else _MISSING)
        picked = c.int("topk_group", default=4 if v3 else _MISSING)
        if e % groups or picked > groups:
            raise c.fail(f"n_group ({groups}) must divide n_routed_experts ({e}) and be >= topk_group ({picked})")
        if groups > 1:
            f["moe"] = replace(f["moe"], route_groups=groups, route_group_topk=picked)
    return f


def _nemotron(c: _Cfg) -> dict:
    """HF modeling_nemotron (transformers 5.24): q/k/v/o with bias=attention_bias (:244-247), a plain two-matrix MLP
    up_proj -> ACT2FN[hidden_act] -> down_proj with bias=mlp_bias (:172-183; relu2 = relu then square,
    activations.py:206-214), NemotronLayerNorm1P (LayerNorm with weight and bias, applied as weight + 1; :62-80) before
    attention, before the MLP and after the last layer (the + 1 and its autocast casts: the family fact norm_one_plus,
    data/families.json), untied lm_head (configuration_nemotron.py:68). Defaults from
    NemotronConfig (configuration_nemotron.py:53-72): head_dim hidden/heads, relu2, attention/mlp bias off.
    NB: NemotronConfig leaves num_key_value_heads None when absent, which NemotronAttention cannot build; taken as
    num_attention_heads (MHA) here."""
    hidden = c.int("hidden_size")
    heads = c.int("num_attention_heads")
    kv, hd = _heads(c, hidden, heads)
    ab = c.bool("attention_bias", default=False)
    return dict(
        causal=True, hidden=hidden, layers=c.int("num_hidden_layers"), heads=heads, kv_heads=kv, head_dim=hd,
        intermediate=c.int("intermediate_size"), vocab=c.int("vocab_size"),
        max_positions=c.int("max_position_embeddings"), gated_mlp=False,
        activation=c.str("hidden_act", default="relu2"), norm="layernorm", norm_bias=True, positions="rotary",
        tied_embeddings=c.bool("tie_word_embeddings", default=False),
        qkv_bias=ab, out_bias=ab, mlp_bias=c.bool("mlp_bias", default=False), dtype=c.dtype(),
    )


def _nemotron_h_blocks(c: _Cfg) -> list[str]:
    """The block kinds, one per layer (configuration_nemotron_h.py __post_init__ and _pattern_to_list): the
    `layers_block_type` list (or its alias `layer_types`; legacy names "mamba"/"attention" remapped by
    configuration_utils.py remap_legacy_layer_types), else `hybrid_override_pattern` (M mamba, * attention, - mlp,
    E moe), else NemotronHConfig's default [mamba, moe, attention, mlp]. Its length is the layer count
    (num_hidden_layers is ignored)."""
    kinds = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe", "linear_attention": "mamba", "mamba": "mamba",
             "full_attention": "attention", "attention": "attention", "mlp": "mlp", "moe": "moe"}
    raw = c.d.get("layers_block_type") or c.d.get("layer_types")
    if raw is None:
        pattern = c.d.get("hybrid_override_pattern")
        raw = list(pattern) if isinstance(pattern, str) else ["mamba", "moe", "attention", "mlp"]
    if not isinstance(raw, list) or not raw or any(k not in kinds for k in raw):
        raise c.fail(f"layer types {raw!r}: expected a list of mamba/attention/mlp/moe blocks")
    return [kinds[k] for k in raw]


def _nemotron_h(c: _Cfg) -> dict:
    """Nemotron-H (transformers 5.24 models/nemotron_h/modeling_nemotron_h.py NemotronHForCausalLM; defaults of
    NemotronHConfig, configuration_nemotron_h.py:96-156): embeddings, blocks of one NemotronHRMSNorm + one mixer
    (NemotronHBlock, :934-994): a Mamba-2 mixer (NemotronHMamba2Mixer, :398-448), attention without positions or
    biases (NemotronHAttention, :874-886: q/k/v/o bias=False whatever attention_bias says, head_dim from `head_dim`,
    default 128; no rotary embedding in NemotronHModel), or a plain up/down MLP of mlp_hidden_act (relu2) with
    bias=mlp_bias (NemotronHMLP, :639-651); norm_f, untied lm_head. MoE blocks ("E", Nemotron 3) are refused."""
    blocks = _nemotron_h_blocks(c)
    if "moe" in blocks:
        raise c.fail("Nemotron-H MoE blocks (E / 'moe' layer types) are not supported yet")
    hidden = c.int("hidden_size", default=4096)
    heads = c.int("num_attention_heads", default=32)
    hybrid = HybridSpec(
        mamba_layers=blocks.count("mamba"), attention_layers=blocks.count("attention"), mlp_layers=blocks.count("mlp"),
        ssm_heads=c.int("mamba_num_heads", default=128), ssm_head_dim=c.int("mamba_head_dim", default=64),
        d_state=c.int("ssm_state_size", default=128), n_groups=c.int("n_groups", "mamba_n_groups", default=8),
        conv_kernel=c.int("conv_kernel", "mamba_d_conv", default=4),
        conv_bias=c.bool("use_conv_bias", "mamba_conv_bias", default=True), proj_bias=c.bool("use_bias", default=False),
        chunk_size=c.int("chunk_size", "mamba_chunk_size", default=128), pattern=tuple(blocks),
    )
    if hybrid.ssm_heads % hybrid.n_groups:
        raise c.fail(f"mamba_num_heads ({hybrid.ssm_heads}) is not a multiple of n_groups ({hybrid.n_groups})")
    return dict(
        causal=True, hidden=hidden, layers=len(blocks), heads=heads,
        kv_heads=c.int("num_key_value_heads", default=8), head_dim=c.int("head_dim", default=128),
        intermediate=c.int("intermediate_size", default=21504), vocab=c.int("vocab_size", default=131072),
        max_positions=c.int("max_position_embeddings", default=4096), gated_mlp=False,
        activation=c.str("mlp_hidden_act", default="relu2"), norm="rmsnorm", norm_bias=False, positions="none",
        norms_per_layer=1, tied_embeddings=c.bool("tie_word_embeddings", default=False),
        mlp_bias=c.bool("mlp_bias", default=False), dtype=c.dtype(), hybrid=hybrid,
    )


def _llama4_rope_layers(c: _Cfg, layers: int) -> tuple[int, int, int]:
    """(the RoPE layers, the first NoPE layer's index (`layers`: none), the interval of the NoPE layers: _nope_every)
    as Llama4TextConfig.__post_init__ (configuration_llama4.py) flags them: `no_rope_layers` (1 = RoPE), else every
    `no_rope_layer_interval`-th layer (default 4) without RoPE, counted rather than listed (a config of 10**9
    layers)."""
    given = c.get("no_rope_layers", default=None)
    if given:  # an empty list is replaced by the default, as transformers does
        if not isinstance(given, list) or len(given) < layers:
            raise c.fail(f"'no_rope_layers' must list at least num_hidden_layers ({layers}) 0/1 flags")
        rope = [1 if x else 0 for x in given[:layers]]
        return sum(rope), next((i for i, r in enumerate(rope) if not r), layers), _nope_every(rope)
    step = c.int("no_rope_layer_interval", default=4)
    # layers step - 1, 2·step - 1, ... are NoPE; an interval of 1 (every layer NoPE) is no interval (_nope_every)
    return layers - layers // step, min(step - 1, layers), step if 2 <= step <= layers else 0


def _llama4_moe_layers(c: _Cfg, layers: int) -> int:
    """Llama4TextDecoderLayer: MoE iff layer_idx in config.moe_layers, which defaults to
    range(interleave_moe_layer_step - 1, layers, interleave_moe_layer_step) (configuration_llama4.py)."""
    given = c.get("moe_layers", default=None)
    if given is None:  # counted, not listed (a config of 10**9 layers)
        step = c.int("interleave_moe_layer_step", default=1)
        return len(range(step - 1, layers, step))
    if not isinstance(given, list):
        raise c.fail(f"'moe_layers' must be a list of layer indices, got {given!r}")
    return sum(1 for i in _listed_layers(given) if 0 <= i < layers)


def _nope_every(rope: list[int]) -> int:
    """The interval at which the NoPE layers (rope flag 0) recur, every step-th from the step-th on (Llama4TextConfig's
    no_rope_layer_interval pattern); 0 where the flags follow no such interval or have no NoPE layer. The pattern of
    interval `step` has its first NoPE layer at step - 1: that one interval is the only candidate (one pass, not one
    per interval)."""
    step = next((i for i, r in enumerate(rope) if not r), -1) + 1
    return step if step >= 2 and all(r == int((i + 1) % step != 0) for i, r in enumerate(rope)) else 0


def _llama4_moe_step(c: _Cfg, layers: int) -> int:
    """The step of Llama 4's MoE interleave where the MoE layers are every step-th (step - 1, 2·step - 1, ...), as
    configuration_llama4.py's default moe_layers places them; 0 for an explicit list of another pattern."""
    step = c.int("interleave_moe_layer_step", default=1)
    given = c.get("moe_layers", default=None)
    if step < 1:
        return 0
    every = range(step - 1, layers, step)
    if isinstance(given, list):  # (compared by length first: the range is not listed unless as long as the list)
        listed = [i for i in given if i < layers]
        if len(listed) != len(every) or listed != list(every):
            return 0
    return step


def _llama4_text(c: _Cfg) -> dict:
    """Llama 4 text (modeling_llama4.py Llama4ForCausalLM; defaults of Llama4TextConfig, configuration_llama4.py,
    which are Scout's): GQA attention with RoPE on 3 of 4 layers (chunked local attention there, L2-normalised q/k
    when use_qk_norm) and NoPE full attention on the rest (q scaled by position when attn_temperature_tuning); MoE
    layers of num_local_experts experts (intermediate_size wide, sigmoid top-k router) plus a shared expert of the
    same width; dense layers an MLP of intermediate_size_mlp."""
    f = _rope_decoder(c, tie_default=False, head_dim_default=128, kv_default=8)
    layers = f["layers"]
    ab = c.bool("attention_bias", default=False)  # Llama4TextAttention: q/k/v/o bias=config.attention_bias
    roped, first_nope, nope_every = _llama4_rope_layers(c, layers)
    chunk = c.int("attention_chunk_size", default=8192) if c.d.get("attention_chunk_size", 8192) is not None else None
    types = c.d.get("layer_types")
    if isinstance(types, list) and len(types) >= layers:
        chunked = sum(1 for t in types[:layers] if t == "chunked_attention")
        lead = next((i for i, t in enumerate(types[:layers]) if t != "chunked_attention"), layers)
    else:  # __post_init__: "chunked_attention" where the layer has RoPE and a chunk size is set
        chunked = roped if chunk is not None else 0
        lead = first_nope if chunked else 0
    temp = c.d.get("attn_temperature_tuning", True)  # bool in transformers 5.24; the hub's Scout config says 4
    e = c.int("num_local_experts", default=16)
    n_moe = _llama4_moe_layers(c, layers) if e > 0 else 0
    f.update(
        qkv_bias=ab, out_bias=ab,
        intermediate=c.int("intermediate_size_mlp", default=16384),  # Llama4TextMLP(intermediate_size_mlp)
        attention_chunk=chunk if chunked else None, chunked_layers=chunked,
        sliding_lead=lead,  # chunked layers before the first full one: their caches are windows (inference.py)
        nope_layers=layers - roped,
        nope_every=nope_every,
        qk_l2_norm_layers=roped if c.bool("use_qk_norm", default=True) else 0,
        attn_temperature=bool(temp) and roped < layers,
    )
    if n_moe == 0:
        return f
    k = c.int("num_experts_per_tok", default=1)
    if k > e:
        raise c.fail(f"num_experts_per_tok ({k}) exceeds num_local_experts ({e})")
    width = c.int("intermediate_size", default=8192)
    f["moe"] = MoESpec(
        num_experts=e, top_k=k, expert_intermediate=width,
        shared_intermediate=width,  # Llama4TextMoe.shared_expert = Llama4TextMLP(config): intermediate_size
        sparse_layers=None if n_moe == layers else n_moe,
        # Llama4Router.forward: topk over the logits, then sigmoid of the top values (-inf elsewhere -> 0)
        router_scoring="sigmoid_topk", experts_every_token=True, layer_step=_llama4_moe_step(c, layers),
    )
    return f


def _gpt_oss(c: _Cfg) -> dict:
    """gpt-oss (modeling_gpt_oss.py GptOssForCausalLM; defaults of GptOssConfig, configuration_gpt_oss.py, which are
    gpt-oss-120b's): q/k/v/o with bias=attention_bias (default True) and a (heads,) `sinks` logit per layer
    (GptOssAttention.__init__), "sliding_attention" layers of `sliding_window` (default 128) alternating with full
    ones (layer_types; __post_init__: layer i sliding when i is even), every layer an MoE of num_local_experts experts
    (GptOssMLP: GptOssTopKRouter Linear(hidden, E) with bias, topk then softmax over the top values;
    GptOssExperts: gate_up_proj (E, H, 2I) + bias (E, 2I), down_proj (E, I, H) + bias (E, H), the clamped SwiGLU of
    swiglu_limit), RMSNorms, untied lm_head."""
    f = _rope_decoder(c, tie_default=False, head_dim_default=64, kv_default=8)
    ab = c.bool("attention_bias", default=True)
    e = c.int("num_local_experts", "num_experts", default=128)
    k = c.int("num_experts_per_tok", default=4)
    if k > e:
        raise c.fail(f"num_experts_per_tok ({k}) exceeds num_local_experts ({e})")
    f.update(qkv_bias=ab, out_bias=ab, attn_sinks=True)
    window = _window(c) if "sliding_window" in c.d else 128  # GptOssConfig.sliding_window
    # layer_types when given, else GptOssConfig.__post_init__: layer i is sliding when (i + 1) % 2 -> ceil(layers / 2)
    n = (_sliding_layers(c, f["layers"]) if "layer_types" in c.d
         else (math.ceil(f["layers"] / 2) if f["layers"] > 1 else None))
    if window is not None and n != 0:
        f.update(sliding_window=window, sliding_window_layers=n, sliding_lead=_sliding_lead(c, 1))
    f["moe"] = MoESpec(
        num_experts=e, top_k=k, expert_intermediate=f["intermediate"],
        norm_topk=True,  # softmax over the top-k logits == the renormalised top-k of the full softmax
        router_scoring="topk_softmax",  # GptOssTopKRouter.forward: topk, then softmax over the k top values
        router_bias=True, expert_bias=True,
        swiglu_limit=float(c.get("swiglu_limit", default=7.0)),
        experts_mxfp4=quant_method(c.d) == "mxfp4",
    )
    return f


def _linear_attention_layers(c: _Cfg, layers: int) -> tuple[int, int]:
    """(how many, the last one's index; -1: none) of the "linear_attention" layers: `layer_types` when given, else
    Qwen3NextConfig.__post_init__ (configuration_qwen3_next.py): layer i is linear unless
    (i + 1) % full_attention_interval == 0 (default 4), counted rather than listed (a config of 10**9 layers)."""
    lt = c.d.get("layer_types")
    if isinstance(lt, list) and lt:
        if len(lt) != layers:
            raise c.fail(f"layer_types has {len(lt)} entries for {layers} layers")
        linear = [i for i, t in enumerate(lt) if t == "linear_attention"]
        return len(linear), linear[-1] if linear else -1
    interval = c.int("full_attention_interval", default=4, minimum=1)
    if interval == 1:
        return 0, -1
    # the last layer is the full one when interval divides the count; the one before it is linear then
    return layers - layers // interval, layers - 1 if layers % interval else layers - 2


def _qwen3_next(c: _Cfg) -> dict:
    """Qwen3-Next (modeling_qwen3_next.py Qwen3NextForCausalLM; defaults of Qwen3NextConfig,
    configuration_qwen3_next.py, which are Qwen3-Next-80B-A3B's but for intermediate_size): Gated DeltaNet layers
    (GatedDeltaNetSpec) and gated full-attention layers (q_proj 2 * heads * head_dim: q and a sigmoid output gate;
    q_norm/k_norm over head_dim; head_dim 256, 2 kv heads when absent; partial rotary, 0.25 by default), a Qwen-MoE
    block (router, num_experts experts of moe_intermediate_size, a gated shared expert with shared_expert_gate) on
    the layers _moe_layers picks, a dense MLP of intermediate_size elsewhere; zero-centred RMSNorms (1 + w; same
    parameter count). The checkpoint's MTP module is not built (Qwen3NextPreTrainedModel
    _keys_to_ignore_on_load_unexpected = [r"^mtp.*"]): the counts are those of what transformers builds."""
    f = _rope_decoder(c, tie_default=False, head_dim_default=256, kv_default=2)
    ab = c.bool("attention_bias", default=False)
    f.update(qkv_bias=ab, out_bias=ab, qk_norm=True, attn_output_gate=True)
    linear, last = _linear_attention_layers(c, f["layers"])
    if linear:
        f["linear_attn"] = GatedDeltaNetSpec(
            layers=linear, last=last,
            key_heads=c.int("linear_num_key_heads", default=16),
            value_heads=c.int("linear_num_value_heads", default=32),
            key_head_dim=c.int("linear_key_head_dim", default=128),
            value_head_dim=c.int("linear_value_head_dim", default=128),
            conv_kernel=c.int("linear_conv_kernel_dim", default=4),
        )
    e = c.int("num_experts", default=512, minimum=0)
    k = c.int("num_experts_per_tok", default=10)
    n_moe = _moe_layers(c, f["layers"], e)
    if n_moe == 0:
        return f
    if k > e:
        raise c.fail(f"num_experts_per_tok ({k}) exceeds num_experts ({e})")
    f["moe"] = MoESpec(
        num_experts=e, top_k=k, expert_intermediate=c.int("moe_intermediate_size", default=512),
        # Qwen3NextSparseMoeBlock: shared_expert (Qwen3NextMLP) + shared_expert_gate Linear(hidden, 1, bias=False)
        shared_intermediate=c.int("shared_expert_intermediate_size", default=512, minimum=0), shared_gate=True,
        sparse_layers=None if n_moe == f["layers"] else n_moe,
        norm_topk=c.bool("norm_topk_prob", default=True),  # Qwen3NextConfig.norm_topk_prob = True
    )
    return f


def _gpt2(c: _Cfg) -> dict:
    # HF modeling_gpt2: wte, wpe, Conv1D c_attn (3h) / c_proj / c_fc / c_proj, all biased; ln_1, ln_2, ln_f
    if c.bool("add_cross_attention", default=False):
        raise c.fail("GPT-2 with add_cross_attention is not supported (decoder-only models only)")
    hidden = c.int("n_embd", "hidden_size")
    heads = c.int("n_head", "num_attention_heads")
    if hidden % heads:
        raise c.fail(f"n_embd {hidden} is not divisible by n_head {heads}")
    return dict(
        causal=True, hidden=hidden, layers=c.int("n_layer", "num_hidden_layers"), heads=heads,
        kv_heads=heads, head_dim=hidden // heads,
        intermediate=c.int("n_inner", default=4 * hidden),
        vocab=c.int("vocab_size"), max_positions=c.int("n_positions", "max_position_embeddings"),
        gated_mlp=False, activation=c.str("activation_function", default="gelu_new"),
        norm="layernorm", positions="learned",
        tied_embeddings=c.bool("tie_word_embeddings", default=True),
        qkv_bias=True, out_bias=True, mlp_bias=True, dtype=c.dtype(),
    )


def _gpt_neox(c: _Cfg) -> dict:
    # HF modeling_gpt_neox: embed_in, query_key_value + dense (bias=attention_bias), biased MLP,
    # input/post_attention LayerNorms, final_layer_norm, untied embed_out (lm_head)
    hidden = c.int("hidden_size")
    heads = c.int("num_attention_heads")
    if hidden % heads:
        raise c.fail(f"hidden_size {hidden} is not divisible by num_attention_heads {heads}")
    ab = c.bool("attention_bias", default=True)
    return dict(
        causal=True, hidden=hidden, layers=c.int("num_hidden_layers"), heads=heads, kv_heads=heads,
        head_dim=hidden // heads, intermediate=c.int("intermediate_size"), vocab=c.int("vocab_size"),
        max_positions=c.int("max_position_embeddings"), gated_mlp=False,
        activation=c.str("hidden_act", default="gelu"), norm="layernorm", positions="rotary",
        tied_embeddings=c.bool("tie_word_embeddings", default=False),
        parallel_residual=c.bool("use_parallel_residual", default=True),
        qkv_bias=ab, out_bias=ab, mlp_bias=True, dtype=c.dtype(),
    )


def _opt(c: _Cfg) -> dict:
    # HF modeling_opt: embed_tokens (vocab x word_embed_proj_dim), OPTLearnedPositionalEmbedding
    # (max_position_embeddings + 2 rows), project_in/out (no bias) when word_embed_proj_dim != hidden,
    # q/k/v/out_proj and fc1/fc2 with bias=enable_bias, final_layer_norm only if do_layer_norm_before
    hidden = c.int("hidden_size")
    heads = c.int("num_attention_heads")
    if hidden % heads:
        raise c.fail(f"hidden_size {hidden} is not divisible by num_attention_heads {heads}")
    proj = c.int("word_embed_proj_dim", default=hidden)
    bias = c.bool("enable_bias", default=True)
    return dict(
        causal=True, hidden=hidden, layers=c.int("num_hidden_layers"), heads=heads, kv_heads=heads,
        head_dim=hidden // heads, intermediate=c.int("ffn_dim"), vocab=c.int("vocab_size"),
        max_positions=c.int("max_position_embeddings"), gated_mlp=False,
        activation=c.str("activation_function", default="relu"), norm="layernorm", positions="learned",
        position_offset=2, tied_embeddings=c.bool("tie_word_embeddings", default=True),
        qkv_bias=bias, out_bias=bias, mlp_bias=bias,
        norm_affine=c.bool("layer_norm_elementwise_affine", default=True),
        final_norm=c.bool("do_layer_norm_before", default=True)
        and not c.bool("_remove_final_layer_norm", default=False),
        embed_proj_dim=proj if proj != hidden else 0, dtype=c.dtype(),
    )


def _bert(c: _Cfg, *, roberta: bool = False) -> dict:
    # HF modeling_bert BertForMaskedLM: word/position/token_type embeddings + LayerNorm; per layer
    # query/key/value/dense (biased) + LayerNorm, intermediate + output dense (biased) + LayerNorm;
    # no pooler; cls.predictions.transform (dense + LayerNorm), decoder tied to word embeddings + bias.
    # RobertaForMaskedLM: same shapes; position rows = max_position_embeddings (incl. padding offset).
    if c.bool("is_decoder", default=False) or c.bool("add_cross_attention", default=False):
        raise c.fail(f"{c.mt} as a decoder (is_decoder/add_cross_attention) is not supported")
    pet = c.str("position_embedding_type", default="absolute")
    if pet != "absolute":
        raise c.fail(f"position_embedding_type '{pet}' is not supported (only 'absolute')")
    hidden = c.int("hidden_size")
    heads = c.int("num_attention_heads")
    if hidden % heads:
        raise c.fail(f"hidden_size {hidden} is not divisible by num_attention_heads {heads}")
    rows = c.int("max_position_embeddings")
    offset = 0
    if roberta:
        offset = c.int("pad_token_id", default=1, minimum=0) + 1  # positions start at padding_idx + 1
        if rows <= offset:
            raise c.fail(f"max_position_embeddings {rows} leaves no positions after the padding offset")
    return dict(
        causal=False, hidden=hidden, layers=c.int("num_hidden_layers"), heads=heads, kv_heads=heads,
        head_dim=hidden // heads, intermediate=c.int("intermediate_size"), vocab=c.int("vocab_size"),
        max_positions=rows - offset, position_offset=offset, gated_mlp=False,
        activation=c.str("hidden_act", default="gelu"), norm="layernorm", positions="learned",
        tied_embeddings=c.bool("tie_word_embeddings", default=True),
        qkv_bias=True, out_bias=True, mlp_bias=True, final_norm=False, embedding_norm=True,
        type_vocab=c.int("type_vocab_size", default=2, minimum=0), lm_head_bias=True,
        mlm_transform=True, dtype=c.dtype(),
    )


def _qwen2_5_vl(c: _Cfg) -> dict:
    """Qwen2.5-VL (Qwen2_5_VLForConditionalGeneration): a Qwen2 language model (modeling_qwen2_5_vl.py
    Qwen2_5_VLAttention :619-622: q/k/v bias, o_proj none; Qwen2_5_VLTextConfig defaults num_key_value_heads 8) and
    the image encoder's VisionTowerSpec (models/vlm.py)."""
    from .vlm import text_config, tower_spec

    f = _qwen2(_Cfg(text_config(c.d), c.name, c.mt), kv_default=8)
    f["vision"] = tower_spec(c.d, c.name, c.mt)
    return f


def _qwen3_vl(c: _Cfg) -> dict:
    """Qwen3-VL (Qwen3VLForConditionalGeneration): a Qwen3 language model (modeling_qwen3_vl.py Qwen3VLTextAttention:
    q/k RMSNorms, biases by attention_bias; Qwen3VLTextConfig defaults head_dim 128, num_key_value_heads 32,
    configuration_qwen3_vl.py:85-100) and the image encoder's VisionTowerSpec (models/vlm.py)."""
    from .vlm import text_config, tower_spec

    f = _qwen3(_Cfg(text_config(c.d), c.name, c.mt), kv_default=32)
    f["vision"] = tower_spec(c.d, c.name, c.mt)
    return f


def _gemma3(c: _Cfg) -> dict:
    """Gemma 3 with images (Gemma3ForConditionalGeneration): the gemma3_text language model from text_config
    (Gemma3TextConfig's defaults, as _gemma3_text; tie_word_embeddings True, configuration_gemma3.py:212) and the
    SigLIP tower with its projector (models/vlm.py)."""
    from .vlm import text_config, tower_spec

    f = _gemma3_text(_Cfg(text_config(c.d), c.name, "gemma3_text"))
    f["vision"] = tower_spec(c.d, c.name, c.mt)
    return f


def _mllama(c: _Cfg) -> dict:
    """Llama 3.2 Vision (MllamaForConditionalGeneration): a Llama language model from text_config (MllamaTextConfig's
    defaults; MllamaTextSelfAttention: no biases, head_dim = hidden / heads, modeling_mllama.py:517-535) whose
    cross-attention layers read the tiled vision tower's tokens (models/mllama.py)."""
    from .mllama import text_config, tower_spec

    f = _llama(_Cfg(text_config(c.d), c.name, "mllama_text_model"))
    f["vision"] = tower_spec(c.d, c.name, f["hidden"], f["layers"])
    return f


# The T5Config / MT5Config defaults that set shapes (configuration_t5.py:43-55, configuration_mt5.py:42-54)
_T5_DEFAULTS = dict(d_model=512, d_ff=2048, num_layers=6, num_heads=8, vocab_size=32128, feed_forward_proj="relu")
_MT5_DEFAULTS = dict(d_model=512, d_ff=1024, num_layers=8, num_heads=6, vocab_size=250112,
                     feed_forward_proj="gated-gelu")


def _t5_activation(c: _Cfg, default: str) -> tuple[str, bool]:
    """(activation, gated) from feed_forward_proj (T5Config.__post_init__, configuration_t5.py:68-74: "relu" -> relu,
    "gated-gelu" -> gelu_new gated; validate_architecture refuses anything but ACT or gated-ACT)."""
    proj = c.str("feed_forward_proj", default=default)
    parts = proj.split("-")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise c.fail(f"feed_forward_proj '{proj}' is not ACT or gated-ACT (e.g. 'relu', 'gated-gelu')")
    act = "gelu_new" if proj == "gated-gelu" else parts[-1]
    return act, len(parts) == 2


def _t5(c: _Cfg, mt5: bool = False) -> dict:
    # HF modeling_t5.py T5ForConditionalGeneration (:900-935): `shared` Embedding(vocab, d_model) that both stacks'
    # embed_tokens and lm_head tie to (transformers 5.24 forces tie_word_embeddings=True, configuration_t5.py:78-82;
    # the config's own false only turns off the decoder-output scaling). Each T5Stack (:644-660): blocks of
    # T5LayerSelfAttention (q, k, v, o: d_model <-> num_heads * d_kv, no biases; T5LayerNorm, a weight-only RMS
    # norm) [+ T5LayerCrossAttention in the decoder] + T5LayerFF (wi or wi_0/wi_1, wo, no biases), the first block's
    # relative_attention_bias (buckets x heads), final_layer_norm. mT5 (modeling_mt5.py MT5ForConditionalGeneration)
    # is the same model with its own defaults; it ties always too (configuration_mt5.py __post_init__) and never
    # scales the decoder output (its forward goes straight to lm_head).
    d = _MT5_DEFAULTS if mt5 else _T5_DEFAULTS
    if c.bool("is_decoder", default=False):
        raise c.fail("t5 as a bare decoder (is_decoder: true) is not supported; pass the encoder-decoder config")
    # T5ForConditionalGeneration._shift_right reads it to build decoder_input_ids from the labels (modeling_t5.py:622-623;
    # T5Config has no default, MT5Config's is 0): a T5 config without it cannot train
    if not mt5:
        c.int("decoder_start_token_id", minimum=0)
    # T5Config.attribute_map (configuration_t5.py:36-41): hidden_size, num_attention_heads, num_hidden_layers and
    # head_dim are aliases of d_model, num_heads, num_layers and d_kv; given both, the alias wins (it is set last)
    hidden = c.int("hidden_size", "d_model", default=d["d_model"])
    heads = c.int("num_attention_heads", "num_heads", default=d["num_heads"])
    layers = c.int("num_hidden_layers", "num_layers", default=d["num_layers"])
    act, gated = _t5_activation(c, d["feed_forward_proj"])
    encdec = EncoderDecoderSpec(
        decoder_layers=c.int("num_decoder_layers", default=layers),
        relative_buckets=c.int("relative_attention_num_buckets", default=32),
        relative_max_distance=c.int("relative_attention_max_distance", default=128),
        scale_decoder_outputs=not mt5 and c.d.get("tie_word_embeddings") is not False,
    )
    return dict(
        causal=True,  # the decoder generates (causal self-attention, a KV cache); the encoder's side is `encdec`
        hidden=hidden, layers=layers, heads=heads, kv_heads=heads, head_dim=c.int("head_dim", "d_kv", default=64),
        intermediate=c.int("d_ff", default=d["d_ff"]), vocab=c.int("vocab_size", default=d["vocab_size"]),
        max_positions=0,  # relative positions: no table bounds the sequence
        gated_mlp=gated, activation=act, norm="rmsnorm", norm_bias=False, positions="relative",
        tied_embeddings=True, final_norm=True, dtype=c.dtype(), encdec=encdec,
    )


def _bart(c: _Cfg) -> dict:
    # HF modeling_bart.py BartForConditionalGeneration (:799-812): BartModel's `shared` Embedding(vocab, d_model), tied
    # to both stacks' embed_tokens (BartModel._tied_weights_keys) and, under tie_word_embeddings (default True), to
    # lm_head; a final_logits_bias BUFFER (1, vocab). Each stack (BartEncoder :463-500, BartDecoder :552-590): its own
    # BartLearnedPositionalEmbedding (max_position_embeddings + 2 rows, the offset of 2) and layernorm_embedding, no
    # final norm; post-norm blocks of BartAttention (q/k/v/out_proj with biases) + LayerNorm [+ the decoder's
    # encoder_attn + LayerNorm] + fc1/fc2 (biased) + LayerNorm (BartEncoderLayer :260-280, BartDecoderLayer :311-341).
    # BartConfig.attribute_map (configuration_bart.py:42-46): hidden_size, num_attention_heads, num_hidden_layers.
    hidden = c.int("hidden_size", "d_model", default=1024)
    heads = c.int("num_attention_heads", "encoder_attention_heads", default=16)
    ffn = c.int("encoder_ffn_dim", default=4096)
    decoder_heads = c.int("decoder_attention_heads", default=16)
    for n in (heads, decoder_heads):
        if hidden % n:
            raise c.fail(f"d_model {hidden} is not divisible by {n} attention heads")
    layers = c.int("num_hidden_layers", "encoder_layers", default=12)
    return dict(
        causal=True,  # the decoder generates (causal self-attention, a KV cache); the encoder's side is `encdec`
        hidden=hidden, layers=layers, heads=heads, kv_heads=heads, head_dim=hidden // heads, intermediate=ffn,
        vocab=c.int("vocab_size", default=50265), max_positions=c.int("max_position_embeddings", default=1024),
        position_offset=2, gated_mlp=False, activation=c.str("activation_function", default="gelu"),
        norm="layernorm", positions="learned", tied_embeddings=c.bool("tie_word_embeddings", default=True),
        qkv_bias=True, out_bias=True, mlp_bias=True, final_norm=False, embedding_norm=True, dtype=c.dtype(),
        encdec=EncoderDecoderSpec(decoder_layers=c.int("decoder_layers", default=12), relative_buckets=0,
                                  relative_max_distance=0, scale_decoder_outputs=False, decoder_heads=decoder_heads,
                                  decoder_intermediate=c.int("decoder_ffn_dim", default=4096),
                                  activation_dropout=float(c.get("activation_dropout", default=0.0))),
    )


def _whisper(c: _Cfg) -> dict:
    # HF modeling_whisper.py WhisperForConditionalGeneration (:990-1000): WhisperModel + proj_out tied to the decoder's
    # embed_tokens (tie_word_embeddings, default True). WhisperEncoder (:544-580): conv1 (num_mel_bins -> d_model,
    # kernel 3) and conv2 (d_model -> d_model, kernel 3, stride 2), embed_positions (max_source_positions x d_model,
    # frozen but a parameter), pre-norm blocks, layer_norm. WhisperDecoder (:648-681): embed_tokens, embed_positions
    # (max_target_positions x d_model), blocks with encoder_attn, layer_norm. WhisperAttention (:243-284): q/v/out_proj
    # biased, k_proj not. WhisperConfig.attribute_map (configuration_whisper.py:119-124).
    hidden = c.int("hidden_size", "d_model", default=384)
    heads = c.int("num_attention_heads", "encoder_attention_heads", default=6)
    decoder_heads = c.int("decoder_attention_heads", default=6)
    for n in (heads, decoder_heads):
        if hidden % n:
            raise c.fail(f"d_model {hidden} is not divisible by {n} attention heads")
    return dict(
        causal=True,  # the decoder generates; the audio encoder's side is `encdec`
        hidden=hidden, layers=c.int("num_hidden_layers", "encoder_layers", default=4), heads=heads, kv_heads=heads,
        head_dim=hidden // heads, intermediate=c.int("encoder_ffn_dim", default=1536),
        vocab=c.int("vocab_size", default=51865), max_positions=c.int("max_source_positions", default=1500),
        gated_mlp=False, activation=c.str("activation_function", default="gelu"), norm="layernorm",
        positions="learned", tied_embeddings=c.bool("tie_word_embeddings", default=True), qkv_bias=True,
        out_bias=True, mlp_bias=True, final_norm=True, dtype=c.dtype(),
        encdec=EncoderDecoderSpec(decoder_layers=c.int("decoder_layers", default=4), relative_buckets=0,
                                  relative_max_distance=0, scale_decoder_outputs=False, decoder_heads=decoder_heads,
                                  decoder_intermediate=c.int("decoder_ffn_dim", default=1536),
                                  mel_bins=c.int("num_mel_bins", default=80),
                                  decoder_positions=c.int("max_target_positions", default=448), k_bias=False,
                                  shared_embedding=False,
                                  activation_dropout=float(c.get("activation_dropout", default=0.0))),
    )


_BUILDERS: dict[str, Callable[[_Cfg], dict]] = {
    "llama": _llama,
    "mistral": _mistral,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "gemma": _gemma,
    "gemma2": _gemma2,
    "gemma3_text": _gemma3_text,
    "phi3": _phi3,
    "mixtral": _mixtral,
    "qwen2_moe": lambda c: _qwen_moe(c, shared=True),
    "qwen3_moe": lambda c: _qwen_moe(c, shared=False),
    "deepseek_v2": lambda c: _deepseek(c, v3=False),
    "deepseek_v3": lambda c: _deepseek(c, v3=True),
    "nemotron": _nemotron,
    "llama4_text": _llama4_text,
    "gpt_oss": _gpt_oss,
    "nemotron_h": _nemotron_h,
    "qwen3_next": _qwen3_next,
    "qwen2_5_vl": _qwen2_5_vl,
    "qwen3_vl": _qwen3_vl,
    "gemma3": _gemma3,
    "mllama": _mllama,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "opt": _opt,
    "bert": _bert,
    "roberta": lambda c: _bert(c, roberta=True),
    "t5": _t5,
    "mt5": lambda c: _t5(c, mt5=True),
    "bart": _bart,
    "whisper": _whisper,
}

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_BUILDERS))

# The (embedding, attention-probabilities, residual) dropouts: the config key each family's modeling file reads and
# its config class's default (transformers 5.24); None: the family has no such dropout. OPT has none on the
# embeddings (OPTDecoder.forward adds the positions and goes to the layers).
_LLAMA_DROPOUTS = (None, ("attention_dropout", 0.0), None)  # configuration_llama.py:81 and its copies
_BERT_DROPOUTS = (("hidden_dropout_prob", 0.1), ("attention_probs_dropout_prob", 0.1), ("hidden_dropout_prob", 0.1))
_DROPOUTS: dict[str, tuple] = {
    "gpt2": (("embd_pdrop", 0.1), ("attn_pdrop", 0.1), ("resid_pdrop", 0.1)),  # configuration_gpt2.py:84-86
    "gpt_neox": (None, ("attention_dropout", 0.0), ("hidden_dropout", 0.0)),  # configuration_gpt_neox.py:67-68
    "phi3": (("embd_pdrop", 0.0), ("attention_dropout", 0.0), ("resid_pdrop", 0.0)),  # configuration_phi3.py:66-68
    "opt": (None, ("attention_dropout", 0.0), ("dropout", 0.1)),  # configuration_opt.py:61-62
    "bert": _BERT_DROPOUTS,  # configuration_bert.py:50-51
    "roberta": _BERT_DROPOUTS,  # configuration_roberta.py:50-51
    # configuration_t5.py:52: dropout_rate on the embeddings (T5Stack.dropout), the attention probabilities
    # (T5Attention.dropout) and every residual branch (T5Layer*.dropout)
    "t5": (("dropout_rate", 0.1), ("dropout_rate", 0.1), ("dropout_rate", 0.1)),
    # configuration_bart.py:60-61: dropout on the embeddings and every branch, attention_dropout on the probabilities
    "mt5": (("dropout_rate", 0.1), ("dropout_rate", 0.1), ("dropout_rate", 0.1)),  # configuration_mt5.py:51
    "bart": (("dropout", 0.1), ("attention_dropout", 0.0), ("dropout", 0.1)),
    # configuration_whisper.py:141-142 (dropout, attention_dropout: 0.0)
    "whisper": (("dropout", 0.0), ("attention_dropout", 0.0), ("dropout", 0.0)),
}


def _dropouts(c: _Cfg) -> tuple[float, float, float]:
    out = [0.0 if kd is None else float(c.get(kd[0], default=kd[1])) for kd in _DROPOUTS.get(c.mt, _LLAMA_DROPOUTS)]
    return out[0], out[1], out[2]


def _rotary_fraction(c: _Cfg) -> float:
    """The share of each head's channels that rotary rotates: partial_rotary_factor (Phi-3; transformers 5 moves it
    into rope_parameters) or GPT-NeoX's rotary_pct (modeling_gpt_neox.py `rotary_ndims`); 1.0 when absent.
    NB: GPTNeoXConfig takes rotary_pct = 0.25 when absent (configuration_gpt_neox.py:98)."""
    rope = c.d.get("rope_parameters") or c.d.get("rope_scaling") or {}
    return float(c.d.get("partial_rotary_factor") or c.d.get("rotary_pct")
                 or (rope.get("partial_rotary_factor") if isinstance(rope, dict) else None)
                 or _ROTARY_DEFAULT.get(c.mt, 1.0))


# partial_rotary_factor when the config does not give it: NemotronConfig sets 0.5 (configuration_nemotron.py:76)
# Qwen3NextConfig.__post_init__ sets 0.25 (configuration_qwen3_next.py, kwargs.setdefault("partial_rotary_factor"))
_ROTARY_DEFAULT = {"nemotron": 0.5, "qwen3_next": 0.25}


def _kernel_facts(c: _Cfg) -> dict:
    """The config values the formulas read beyond the shapes (ModelSpec's kernel-fact fields), the same for every
    family; the family builders add their own (soft-capping, the MoE router's)."""
    archs = c.d.get("architectures")
    return dict(
        dropouts=_dropouts(c),
        rotary_fraction=_rotary_fraction(c),
        rope_attention_factor=yarn_attention_factor(c.d),
        # not a transformers field (it builds no MTP module): DeepSeek-V3's config.json states it; absent: none
        mtp_layers=c.int("num_nextn_predict_layers", default=0, minimum=0),
        classifier_dropout=heads.classifier_dropout(c.d, c.mt),
        # GenericForTokenClassification: bias=getattr(config, "token_classification_bias", True)
        # (modeling_layers.py:286)
        token_cls_bias=c.bool("token_classification_bias", default=True),
        architectures=tuple(a for a in archs if isinstance(a, str)) if isinstance(archs, list) else (),
        # an EAGLE-3 draft's config: its own head's rows (SGLang models/llama_eagle3.py:306-318); absent: the vocabulary
        draft_vocab=c.int("draft_vocab_size", default=0, minimum=0),
    )


def spec_from_config(config: dict, name: str, source: str = "", head: str | None = None) -> ModelSpec:
    """Build a ModelSpec from an HF config.json dict. Raises ConfigError (one line) when the
    config is malformed or its model_type is not supported.

    head: the task head to build (trainfit.heads; SetupError when transformers has no such class for the family);
    None = the one the config's `architectures` names, else the family's LM head. A classifier head has no LM head:
    the spec's tied_embeddings / mlm_transform / lm_head_bias (which describe the LM head) are off."""
    supported = ", ".join(SUPPORTED_MODEL_TYPES)
    if not isinstance(config, dict):
        raise ConfigError(f"{name}: config.json must hold a JSON object, got {type(config).__name__}")
    mt = config.get("model_type")
    if not mt:
        raise ConfigError(f"{name}: config.json has no 'model_type'; supported model types: {supported}")
    if not isinstance(mt, str) or mt not in _BUILDERS:
        hint = ""
        if isinstance(config.get("text_config"), dict):
            hint = " (multimodal configs are not supported; pass the text model's config.json)"
        raise ConfigError(f"{name}: model_type '{mt}' is not supported{hint}; supported model types: {supported}")
    raw = {k: v for k, v in config.items() if k != "_trainfit"}
    _check_finite(raw, name)
    cfg = _Cfg(raw, name, mt)
    fields = {**_kernel_facts(cfg), **_BUILDERS[mt](cfg)}
    if fields.get("moe") is not None:
        fields["moe"] = replace(fields["moe"], aux_loss_coeff=_aux_loss_coeff(cfg))
    if head is not None:
        heads.check_available(mt, head, name)
    chosen = head or heads.from_architectures(raw, mt) or heads.family_default(mt, fields["causal"])
    if chosen in heads.CLASSIFIERS:
        fields.update(tied_embeddings=False, mlm_transform=False, lm_head_bias=False)
    spec = ModelSpec(name=name, family=mt, source=source, config=raw, head=chosen,
                     num_labels=heads.config_labels(raw, name), checkpoint_quant=_checkpoint_quant(raw), **fields)
    if spec.moe is not None and spec.moe.num_experts < 1:
        raise ConfigError(f"{name}: an MoE model needs num_experts >= 1")
    return spec


def _aux_loss_coeff(c: _Cfg) -> float | None:
    """The MoE router's load-balancing loss coefficient the config sets (MoESpec.aux_loss_coeff): DeepSeek's
    aux_loss_alpha (configuration_deepseek_v2.py), the others' router_aux_loss_coef (MixtralConfig, Qwen2MoeConfig,
    ...); None where it sets neither. 0 is a coefficient (no loss), not a missing one."""
    v = c.get("aux_loss_alpha", "router_aux_loss_coef", default=None)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        key = "aux_loss_alpha" if c.has("aux_loss_alpha") else "router_aux_loss_coef"
        raise ConfigError(f"{c.name}: '{key}' must be a number >= 0, got {v!r}")
    return float(v)


def quant_method(raw: dict) -> str | None:
    """A config's quantization_config.quant_method, lower case; None for a 16-bit checkpoint. A quantization_config
    that is no JSON object is one line (transformers reads it as a dict: QuantizationConfigMixin.from_dict)."""
    q = raw.get("quantization_config") or {}
    if not isinstance(q, dict):
        raise ConfigError(f"'quantization_config' must be a JSON object (e.g. {{\"quant_method\": \"fp8\"}}), "
                          f"got {_json_type(q)} {q!r:.40}; fix it or drop it")
    return str(q.get("quant_method", "")).lower() or None


def _checkpoint_quant(raw: dict) -> str | None:
    """The checkpoint's quant_method where it is a serving format trainfit models (awq, gptq, fp8: vLLM
    ModelConfig._verify_quantization loads the weights so without --quantization; SGLang alike), else None.
    NB: another method (compressed-tensors, bitsandbytes, ...) is sized at the 16-bit weights: over."""
    from ..setup.vocab import SERVE_QUANTS  # noqa: PLC0415 (setup imports the models' resolver)

    method = quant_method(raw)
    return method if method in SERVE_QUANTS else None


def with_head(spec: ModelSpec, head: str) -> ModelSpec:
    """`spec` with another task head (trainfit.heads), rebuilt from its config so that the LM-head fields and the
    parameter counts are those of transformers' class for that head; itself when it already has it."""
    if head == spec.task_head:
        return spec
    if not spec.config:
        raise SetupError(f"--head {head}: {spec.name} was not built from a config.json; build it with "
                         "trainfit.models.hf_config.spec_from_config to change its head")
    return spec_from_config(spec.config, spec.name, spec.source, head=head)


def one_label(spec: ModelSpec) -> ModelSpec:
    """`spec` whose classifier head has one output (a value or reward head: num_labels=1), in its config too (a head
    is rebuilt from the config: with_head)."""
    return replace(spec, config={**spec.config, "num_labels": 1}, num_labels=1)


def for_setup(spec: ModelSpec, setup: "Setup") -> ModelSpec:
    """The spec of the model `setup` trains: the head `trainfit.heads.resolve` picks (--head, else the config's
    architectures, else the family's LM head; inference: the LM head), as the stack builds it (as_built)."""
    return as_built(with_head(spec, heads.resolve(spec, setup.head, setup.mode)), setup)


def as_built(spec: ModelSpec, setup: "Setup") -> ModelSpec:
    """`spec` as the stack's own model of its family builds it, where that differs from transformers' (stacks/*.toml
    [spec_as_built.<model>], by [moe_models] model: torchtitan's llama4); itself where nothing changes."""
    model = setup.stack_facts.moe_model(spec.family)
    changes = dict(setup.stack_facts.facts.get("spec_as_built", {}).get(model, {}))
    moe = changes.pop("moe", None)
    if moe and spec.moe is not None and any(getattr(spec.moe, k) != v for k, v in moe.items()):
        changes["moe"] = replace(spec.moe, **moe)
    changes = {k: v for k, v in changes.items() if getattr(spec, k) != v}
    return replace(spec, **changes) if changes else spec
