"""llm-analysis (pip `llm-analysis`, run in its own venv: it pins transformers 4.31; see bench/anchors/setup.sh).

    <llm-analysis-venv>/bin/python bench/anchors/llm_analysis_anchor.py cases.json out.json

`LLMAnalysis(model_config, gpu_config, dtype_config).training(...)` / `.inference(...)`, its Python API.
The ModelConfig is built from the HF config the way its own `get_model_config_from_hf` does (layers, heads,
hidden, vocab, max positions, kv heads), plus what that function leaves at defaults and we know
(ffn_embed_dim — it would otherwise assume 4·hidden —, MoE experts/top-k, gated MLP): the most favourable
reading. GPU: a100-sxm-80gb (only the memory check and timings use it).

Settings per case:
- dtype: every policy but fp32 -> its default `w16a16e16`. fp32 is tried with a 32-bit DtypeConfig, which
  llm-analysis 0.2.2 refuses ("weight_bits and activation_bits must be 4, 8, or 16"): fp32 cases are
  reported as not supported.
- training: master_weights_dtype_bytes 4 (its default; 2 for pure bf16, which has no fp32 master),
  other_op_bytes by optimizer (Adam/AdamW: its default 8; momentum 4; SGD and Adafactor 0; bf16 halves them),
  flash_attn = (attention kernel is not eager), activation_recomputation FULL for recompute full,
  softmax_dropout when the config has attention dropout, mlp_gated_linear_units for gated MLPs.
  Prediction: `(weight+op_state+grad+act)_memory_per_gpu`.
- inference: num_tokens_to_generate=1, use_kv_cache; prefill = weights + prefill activations;
  decode = weights + KV cache (seq + 1 tokens) + decode activations (how it checks what fits).
Not modelled: untied embeddings (it counts one vocab×hidden matrix), the fp32 logits and loss, transient
optimizer buffers, the order in which memory is freed (it sums categories), biases and norms in MLP/attention.
"""
from __future__ import annotations

import json
import logging
import sys

GATED = {"llama", "qwen2", "mistral", "mixtral", "gemma", "gemma2", "phi3", "qwen3", "qwen2_moe"}


def model_config(name: str, cfg: dict):
    from llm_analysis.config import ModelConfig

    g = lambda *keys, default=None: next((cfg[k] for k in keys if cfg.get(k) is not None), default)  # noqa: E731
    hidden = g("hidden_size", "n_embd", "d_model")
    ffn = g("intermediate_size", "n_inner", "ffn_dim", "moe_intermediate_size") or 4 * hidden
    experts = g("num_local_experts", "num_experts", default=1)
    return ModelConfig(
        name=name, num_layers=g("num_hidden_layers", "n_layer", "n_layers"),
        n_head=g("num_attention_heads", "n_head", "n_heads"), hidden_dim=hidden, vocab_size=cfg["vocab_size"],
        max_seq_len=g("max_position_embeddings", "n_positions"), num_key_value_heads=g("num_key_value_heads"),
        ffn_embed_dim=ffn, expansion_ratio=ffn / hidden, model_type=cfg.get("model_type"),
        moe_num_experts=experts, moe_top_k=g("num_experts_per_tok", default=1),
    )


def main(cases_path: str, out_path: str) -> None:
    import llm_analysis
    from llm_analysis.analysis import ActivationRecomputation, LLMAnalysis
    from llm_analysis.config import DtypeConfig, get_dtype_config_by_name, get_gpu_config_by_name

    logging.disable(logging.WARNING)
    try:
        from importlib.metadata import version
        tool = f"llm-analysis {version('llm-analysis')}"
    except Exception:  # noqa: BLE001
        tool = "llm-analysis"
    out = {"tool": tool, "results": {}}
    gpu = get_gpu_config_by_name("a100-sxm-80gb")
    for case in json.load(open(cases_path)):
        cfg, prec = case["config"], case["precision"]
        dtype = (DtypeConfig(name="w32a32e32", weight_bits=32, activation_bits=32, embedding_bits=32)
                 if prec == "fp32" else get_dtype_config_by_name("w16a16e16"))
        try:
            a = LLMAnalysis(model_config(case["model"], cfg), gpu, dtype, flops_efficiency=0.5,
                            hbm_memory_efficiency=0.9)
            if case["mode"] == "train":
                pure16 = prec == "bf16"
                op = {"adam": None, "adamw": None, "momentum": 4, "sgd": 0, "adafactor": 0}[case["optimizer"]]
                if pure16:
                    op = 4 if op is None else op // 2
                dropout = any(float(cfg.get(k) or 0) > 0 for k in ("attn_pdrop", "attention_dropout",
                                                                  "attention_probs_dropout_prob"))
                r = a.training(batch_size_per_gpu=case["batch"], seq_len=case["seq"],
                               gradient_accumulation_steps=case["grad_accum"],
                               activation_recomputation=(ActivationRecomputation.FULL if case["recompute"] == "full"
                                                         else ActivationRecomputation.NONE),
                               master_weights_dtype_bytes=2 if pure16 else 4, other_op_bytes=op,
                               flash_attn=case["attention"] != "eager", softmax_dropout=dropout,
                               mlp_gated_linear_units=cfg.get("model_type") in GATED)
                out["results"][case["id"]] = {"step": int(r["(weight+op_state+grad+act)_memory_per_gpu"]),
                                              "model_states": int(r["(weight+op_state+grad)_memory_per_gpu"])}
            else:
                r = a.inference(batch_size_per_gpu=case["batch"], seq_len=case["seq"], num_tokens_to_generate=1,
                                use_kv_cache=True, layernorm_dtype_bytes=4 if prec == "fp32" else 2,
                                kv_cache_dtype_bytes=4 if prec == "fp32" else 2)
                w = r["weight_memory_per_gpu"]
                out["results"][case["id"]] = {
                    "prefill": int(w + r["prefill_activation_memory_per_gpu"]),
                    "decode": int(w + r["kv_cache_memory_per_gpu"] + r["decode_activation_memory_per_gpu"]),
                    "kv_cache": int(r["kv_cache_memory_per_gpu"])}
        except Exception as e:  # noqa: BLE001
            out["results"][case["id"]] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    json.dump(out, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:3])
