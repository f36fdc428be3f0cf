"""Pre-flight inside the trainer (docs/callbacks.md): before the first step, the run estimated from the live
objects (model, optimizer, batch shape, precision, parallel layout) and the verdict printed, the run stopped when
asked and it will not fit; after the first steps, the real peak against the prediction.

  hf.py          TrainfitCallback (HF Trainer), accelerate_preflight (an accelerate loop)
  torchtitan.py  checked(Trainer) / preflight(trainer) (torchtitan's main(trainer_class))
  lightning.py   TrainfitLightningCallback (Lightning, when installed)
  live.py        the settings read from the live model and optimizer
  layouts.py     the settings of TrainingArguments, accelerate, FSDP and DeepSpeed configs
  preflight.py   the estimate, the verdict, the real peak and the comparison

Each trainer's module imports its trainer: import the one you use (trainfit.callbacks.hf, ...)."""
from .preflight import Preflight, WillNotFitError

__all__ = ["Preflight", "WillNotFitError"]
