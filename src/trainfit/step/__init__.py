"""The standard training step (DESIGN.md §3), shared by the measure and trace engines."""
from .build import build_model, hf_config, make_batches
from .standard import MasterWeightOptimizer, make_optimizer, prepare, run_step

__all__ = ["build_model", "hf_config", "make_batches", "make_optimizer", "prepare", "run_step", "MasterWeightOptimizer"]
