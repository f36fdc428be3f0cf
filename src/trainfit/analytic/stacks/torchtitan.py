"""The torchtitan stack: the base behaviour (torch FSDP2/DDP, torch.optim, clip_grad_norm_), over the one model
torchtitan builds here; its facts (FSDP2 groups and mixed precision, rotary buffer, SAC) are stacks/torchtitan.toml."""
from __future__ import annotations

from ...errors import SetupError
from ...setup import Setup
from ...spec import ModelSpec
from .base import StackModel


class TorchtitanModel(StackModel):
    def check_model(self, spec: ModelSpec, setup: Setup) -> None:
        """torchtitan builds its own registry's architectures, and the one trainfit runs is its llama3 Transformer
        (stacks/torchtitan.toml [models]; torchtitan 0.2.2 models/llama3/model/model.py:200 head_dim = dim //
        n_heads, :204-209 and :338-343 bias-free projections and SwiGLU, :448 and :458 separate tok_embeddings
        and output)."""
        if setup.mode != "train":
            return
        if spec.family != "llama" or spec.is_moe or not spec.causal:
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


MODEL = TorchtitanModel()
