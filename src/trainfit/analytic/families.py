"""Kernel facts per HF architecture (data/families.json), merged over the defaults."""
from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from ..models.vlm import NESTED
from ..spec import ModelSpec


@lru_cache(maxsize=1)
def _families() -> dict:
    return json.loads(resources.files("trainfit.data").joinpath("families.json").read_text())


def family_traits(spec: ModelSpec) -> dict:
    """The traits of the family's language model: a VLM whose language model is a family of its own (Gemma 3's
    gemma3_text: models/vlm.py NESTED) takes that family's."""
    fam = _families()
    out = dict(fam["default"])
    out.update(fam.get(_language_family(spec), {}))
    return out


def _language_family(spec: ModelSpec) -> str:
    return NESTED.get(spec.family, spec.family) if spec.vision is not None else spec.family
