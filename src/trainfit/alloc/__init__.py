"""A pure-Python simulation of PyTorch's CUDA caching allocator (caching_allocator.py), its configuration
(config.py, PYTORCH_CUDA_ALLOC_CONF syntax) and the replay of a traced step through it (replay.py)."""
from .caching_allocator import Allocator, OutOfMemory
from .config import AllocConf, parse_alloc_conf

__all__ = ["AllocConf", "Allocator", "OutOfMemory", "parse_alloc_conf"]
