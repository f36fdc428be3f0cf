"""trainfit: will it train (or serve) on my hardware? Memory, compute and the fastest configuration that fits."""

__version__ = "0.1.0"
