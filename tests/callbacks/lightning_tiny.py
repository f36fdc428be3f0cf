"""The tiny Llama every callback test trains (2 layers, hidden 64, vocabulary 256) and the LightningModule around it:
one definition for the one-process tests (test_callbacks_trainers.py) and the two-rank FSDP run
(lightning_fsdp_cpu.py)."""
from __future__ import annotations

import torch
import transformers

CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=256, max_position_embeddings=128)


def tiny_llama() -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))


def token_batches() -> torch.utils.data.DataLoader:
    """Eight 32-token sequences in batches of 2 (seeded)."""
    torch.manual_seed(0)
    return torch.utils.data.DataLoader([torch.randint(0, 256, (32,)) for _ in range(8)], batch_size=2)


def tiny_module_class(L, config: bool = False):
    """A LightningModule (of the `lightning` package L) wrapping tiny_llama(): its forward returns the loss, AdamW.
    Without `config` trainfit's callback traces the module; with it the module carries the model's config, which the
    callback reads (callbacks/live.py model_spec: the analytic engine)."""

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = tiny_llama()
            if config:
                self.config = self.model.config

        def forward(self, input_ids):
            return self.model(input_ids=input_ids, labels=input_ids).loss

        def training_step(self, batch, batch_idx):
            return self(batch)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    return Tiny
