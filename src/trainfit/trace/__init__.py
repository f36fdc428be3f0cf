"""The trace engine (DESIGN.md §4): the real model and step on fake tensors, every allocation recorded.

Importing this package imports torch; the rest of trainfit imports it only when the trace engine is asked for.
"""
from .engine import trace_spec
from .user import load_factory, trace

__all__ = ["load_factory", "trace", "trace_spec"]
