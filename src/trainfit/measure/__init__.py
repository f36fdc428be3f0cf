"""The measure engine: real training steps, true memory peaks (DESIGN.md §4)."""
from .runner import MeasureResult, StepOutOfMemoryError, measure, to_estimate

__all__ = ["MeasureResult", "StepOutOfMemoryError", "measure", "to_estimate"]
