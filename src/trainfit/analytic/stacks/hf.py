"""The hf stack (HF Trainer / accelerate over a transformers model): the base behaviour throughout; its facts are
stacks/hf.toml."""
from .base import StackModel

MODEL = StackModel()
