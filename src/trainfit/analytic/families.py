"""Kernel facts per HF architecture (data/families.json), merged over the defaults."""
from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from ..spec import ModelSpec


@lru_cache(maxsize=1)
def _families() -> dict:
    return json.loads(resources.files("trainfit.data").joinpath("families.json").read_text())


def family_traits(spec: ModelSpec) -> dict:
    fam = _families()
    out = dict(fam["default"])
    out.update(fam.get(spec.family, {}))
    return out
