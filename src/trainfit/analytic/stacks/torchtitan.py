"""The torchtitan stack: the base behaviour (torch FSDP2/DDP, torch.optim, clip_grad_norm_), over the models
torchtitan builds here (its llama3 Transformer; its deepseek_v3, qwen3, llama4 and gpt_oss MoE models, with expert
parallelism: parallel/expert_memory.py); its facts (FSDP2 groups and mixed precision, rotary buffer, SAC, EP layout) are
stacks/torchtitan.toml."""
from __future__ import annotations

from ...errors import SetupError
from ...setup import Setup
from ...spec import ModelSpec
from ..moe_imbalance import busiest_rank_load
from ..parallel import torch_context
from .base import StackModel


class TorchtitanModel(StackModel):
    def check_model(self, spec: ModelSpec, setup: Setup) -> None:
        """torchtitan builds its own registry's architectures, and the one trainfit runs is its llama3 Transformer
        (stacks/torchtitan.toml [models]; torchtitan 0.2.2 models/llama3/model/model.py:200 head_dim = dim //
        n_heads, :204-209 and :338-343 bias-free projections and SwiGLU, :448 and :458 separate tok_embeddings
        and output)."""
        if setup.mode != "train":
            return
        moe_families = setup.stack_facts.fact("moe_models", "families")
        if spec.is_moe and spec.family in moe_families:
            # torchtitan's deepseek_v3 / qwen3 / llama4 MoE models (stacks/torchtitan.toml [moe_models]); their routed
            # experts are GroupedExperts parameters, which the Linear converters leave in bf16 and quantize.grouped_mm's
            # converters (config/job_config.py:755-810) quantize: neither modelled here
            lp = getattr(setup, "low_precision", "none")
            if lp != "none":
                raise SetupError(f"--low-precision {lp} on torchtitan's MoE model {spec.name}: its experts' grouped "
                                 "GEMMs (quantize.grouped_mm) are not modelled; drop --low-precision")
            model = setup.stack_facts.moe_model(spec.family)
            if model in setup.stack_facts.fact("moe_models", "blocks_bf16") and setup.precision != "bf16":
                # torchtitan 0.2.2 models/gpt_oss/model/model.py:339-342: TransformerBlock(...).to(torch.bfloat16)
                raise SetupError(f"--precision {setup.precision} on torchtitan's {model}: it casts its blocks to bf16 "
                                 "whatever training.dtype (model/model.py:339-342), bf16 block states beside fp32 "
                                 "embeddings that trainfit does not model; use --precision bf16 (training.dtype "
                                 "bfloat16)")
            if model == "gpt_oss" and (setup.tp > 1 or setup.cp > 1 or setup.pp > 1):
                # models/gpt_oss/model/args.py:181-184 (CP NotImplementedError), __init__.py:85 (pipelining_fn None);
                # its own TP plan (infra/parallelize.py, infra/expert_parallel.py) is not modelled
                raise SetupError(f"--tp {setup.tp} --cp {setup.cp} --pp {setup.pp} on torchtitan's gpt_oss: trainfit "
                                 "models it with data and expert parallelism only (torchtitan runs no CP or PP for "
                                 "it); use --tp 1 --cp 1 --pp 1, or --stack megatron")
            deepep = setup.stack_facts.fact("expert_dispatch", "deepep")["models"]
            if setup.moe_dispatcher == "deepep" and model not in deepep:
                # (stacks/torchtitan.toml [expert_dispatch.deepep]: only deepseek_v3's MoE class reads the backend)
                raise SetupError(f"--moe-dispatcher deepep: torchtitan's {model} model builds its standard MoE and "
                                 "all-to-all whatever expert_parallel_comm_backend says (models/qwen3/model/model.py:"
                                 f"368); its {', '.join(deepep)} model runs DeepEP: use --moe-dispatcher alltoall")
            return
        if spec.is_moe:
            raise SetupError(f"--stack torchtitan: {spec.name} is a {spec.family} mixture of experts; trainfit models "
                             f"torchtitan's MoE models of model_type {', '.join(moe_families)} (its deepseek_v3, "
                             "qwen3, llama4 and gpt_oss MoE flavors): use --stack hf or --stack megatron")
        if spec.family != "llama" or not spec.causal:
            raise SetupError(f"--stack torchtitan runs torchtitan's Llama3 Transformer, which builds llama-family "
                             f"models (model_type llama) only; {spec.name} is {spec.family}: use --stack hf")
        if spec.tied_embeddings:
            raise SetupError(f"--stack torchtitan: {spec.name} ties its input and output embeddings, which "
                             "torchtitan's llama3 model does not (separate tok_embeddings and output): use --stack hf")
        if spec.qkv_bias or spec.out_bias or spec.mlp_bias or spec.activation != "silu":
            raise SetupError(f"--stack torchtitan: {spec.name} has biases or a non-SiLU MLP, which torchtitan's "
                             "llama3 model (bias-free SwiGLU) does not build: use --stack hf")
        if spec.head_dim * spec.heads != spec.hidden or spec.heads % spec.kv_heads:
            raise SetupError(f"--stack torchtitan: {spec.name} has head_dim {spec.head_dim} x {spec.heads} heads != "
                             f"hidden {spec.hidden}; torchtitan's llama3 derives head_dim = dim // n_heads: use "
                             "--stack hf")

    def cp_comm_seconds(self, spec: ModelSpec, setup: Setup, links, tokens: float, act_bytes: float, layers: int,
                        attention_forward: float, rerun: float) -> float:
        """torch's ring attention as torchtitan runs it: an all-gather of K/V, fp32 dK/dV hops
        (parallel/torch_context.py)."""
        return torch_context.ring_comm_seconds(spec, setup, links, tokens, act_bytes, layers, attention_forward,
                                               rerun)

    def cp_backward_bytes(self, spec: ModelSpec, setup: Setup, tokens: float, act_bytes: float) -> float:
        return torch_context.ring_backward_bytes(spec, setup, tokens, act_bytes)

    def communicators(self, setup: Setup) -> dict[str, int]:
        """The base groups, and with expert parallelism the sparse mesh's ep and efsdp groups (torchtitan
        distributed/parallel_dims.py:154-177: efsdp = dp_shard·tp // (etp·ep), Setup.expert_dp under FSDP; the
        mesh's etp innermost, as overheads.py places Megatron's expert groups)."""
        groups = super().communicators(setup)
        if setup.cp > 1:  # the ring's cp group, and FSDP's over dp_shard × cp (distributed/parallel_dims.py:137,
            groups.update(cp=setup.cp, dp=setup.dp * setup.cp)  # :172-173 the fsdp and cp meshes)
        if setup.ep > 1:
            groups.update(ep=setup.ep, expert_dp=setup.expert_dp)
        return groups

    def warnings(self, spec: ModelSpec, setup: Setup, gpu=None) -> list[str]:
        if spec.is_moe and setup.ep > 1 and setup.recompute == "op":
            return [f"{setup.stack_facts.fact('expert_parallel', 'op_sac_fails')}; --recompute full or none run"]
        return []

    def notes(self, spec: ModelSpec, setup: Setup) -> list[str]:
        out = super().notes(spec, setup)
        if setup.cp > 1:
            out.append(f"context parallelism: torch's ring attention over {setup.cp} ranks (K/V all-gathered each "
                       "layer, fp32 dK/dV passed round the ring, outputs merged in fp32); its cp SDPA calls per layer "
                       "timed as one kernel (their launches not counted)")
        if setup.ep > 1 and spec.is_moe:
            saves = " and ".join(setup.stack_facts.fact("expert_dispatch", "op_sac_saves"))
            load = busiest_rank_load(spec, setup, setup.batch * setup.seq / setup.cp)
            out.append(f"expert parallelism: ep {setup.ep} x etp {setup.expert_tp}; the busiest rank receives "
                       f"{load:.2f}x the balanced routed tokens (analytic/moe_imbalance.py: --moe-imbalance, "
                       "--moe-force-balance), which size its expert activations and dispatch buffers (and, under op "
                       f"SAC, {saves}'s stored all-to-all outputs)")
            if setup.moe_dispatcher == "deepep":
                out.append("DeepEP dispatch and combine: each token sent once to each rank holding one of its experts; "
                           "its routed buffers counted as the all-to-all's (NB: over: DeepEP holds the distinct "
                           "tokens, not their top-k copies), its own buffers (outside PyTorch's allocator) not; the "
                           "shared experts, which run beside the combine (moe_deepep.py), timed after it (NB: "
                           "predicted slower by up to their forward)")
        return out


MODEL = TorchtitanModel()
