"""Multi-token prediction (DeepSeek-V3's MTP modules, the config's num_nextn_predict_layers) as Megatron-Core trains
them (--mtp-layers; megatron-core 0.16.1 megatron/core/transformer/multi_token_prediction.py, models/gpt/gpt_model.py):

  where    without a layout every MTP layer is on the last pipeline stage (multi_token_prediction.py:480-487
           mtp_on_this_rank); a layout string places them with 'm' (:465-479; setup/pp_layout.py). That stage also
           builds the word embedding (gpt_model.py:149-150: pre_process or mtp_process) to embed the shifted tokens.
  layer    MultiTokenPredictionLayer (:589-680, :726-735 _concat_embeddings): enorm and hnorm (RMSNorm over h), the
           two concatenated (2h) into eh_proj (column-parallel 2h -> h), one decoder layer of the model's kind (an
           MoE layer for DeepSeek-V3), a final layernorm; params.mtp_params counts the same.
  loss     each MTP layer's output goes through the shared output layer and its own cross-entropy
           (gpt_model.py:611-660): the LM head and the loss once more per MTP layer.

NB: eh_proj's GEMM (2·2h·h FLOPs per token, < 1/4 of a DeepSeek-V3 layer's) is not timed (predicted faster)."""
from __future__ import annotations

from ..setup import Setup
from ..spec import ModelSpec
from .parallel.pipeline import layout_of


def mtp_layers(spec: ModelSpec, setup: Setup) -> int:
    """--mtp-layers, else the config's num_nextn_predict_layers on a stack that trains them (stacks/*.toml
    [features] mtp: Megatron-Bridge sets mtp_num_layers from it, e.g. models/glm/glm45_bridge.py:77 at v0.2.0), else
    0 (transformers does not build the MTP modules: models/hf_config.py)."""
    if setup.mtp_layers is not None:
        return setup.mtp_layers
    return spec.mtp_layers if setup.stack_facts.runs("mtp") else 0


def stage_mtp(spec: ModelSpec, setup: Setup) -> tuple[int, int, int]:
    """MTP layers on the (first, middle, last) stages (pipeline.split's three; the middle: the busiest middle rank)."""
    n = mtp_layers(spec, setup)
    if not n or setup.pp == 1:
        return n, n, n
    lay = layout_of(setup)
    if lay is None:
        return 0, 0, n
    per = lay.mtp_layers(setup.pp)
    return per[0], max(per[1:-1]) if setup.pp > 2 else per[0], per[-1]


def layer_params(spec: ModelSpec, pc, setup: Setup) -> tuple[float, float]:
    """(dense, expert) parameters of one MTP layer on a rank: eh_proj split t ways, the three norms replicated, the
    decoder layer as the model's MoE layer (its dense one for a dense model), its experts over ep × etp."""
    from .parallel.megatron import routed_expert_params  # (megatron imports pipeline, as this module does)

    t, h = setup.tp, spec.hidden
    moe = spec.moe is not None and pc.moe_layers > 0
    experts = routed_expert_params(spec, pc) if moe else 0.0
    mlp = (pc.moe_mlp - experts) if moe else pc.mlp
    dense = 3 * h + pc.norms + (2 * h * h + pc.attention + mlp) / t
    return dense, experts / (setup.ep * setup.expert_tp)
