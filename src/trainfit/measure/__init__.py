"""The measure engine: real training steps and inference (prefill + decode), true memory peaks (DESIGN.md §4)."""
from .infer import measure_inference
from .runner import MeasureResult, StepOutOfMemoryError, measure, to_estimate

__all__ = ["MeasureResult", "StepOutOfMemoryError", "measure", "measure_inference", "to_estimate"]
