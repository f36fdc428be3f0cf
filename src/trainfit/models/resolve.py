"""Model references -> ModelSpec, fully offline, standard library only (no torch, no transformers,
no huggingface_hub: `trainfit estimate` must start in well under a second).

A reference is, in the order tried:
1. a path to a config.json, or to a folder holding one;
2. a catalog name or alias (case-insensitive), e.g. "llama-3.1-8b", "gpt2-small";
3. an HF hub id "org/name", read from the local HF cache
   (HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub,
   ~/.cache/huggingface/hub; layout models--org--name/snapshots/<rev>/config.json),
   else the catalog entry whose hf_id matches.

Catalog files (models/catalog/<name>.json) are HF config.json copies plus a "_trainfit" object:
name (lowercase, hyphenated), aliases, hf_id, source (where the numbers come from),
params_published / active_published (published totals, checked by tests/models within 2%, or
params_published_tol where the published figure is known to be off, with the reason in source).
Parameter counts are never stored: they are computed from the config by trainfit.analytic.params (api.catalog_models).
"""
from __future__ import annotations

import difflib
import os
import re
from functools import lru_cache
from pathlib import Path

from trainfit.errors import ConfigError, UnknownModelError
from trainfit.models.hf_config import loads_config
from trainfit.models.hf_config import spec_from_config as _text_spec
from trainfit.models.vision import VISION_TYPES, vision_catalog_spec, vision_lookup, vision_names, vision_spec
from trainfit.spec import ModelSpec, VisionSpec

CATALOG_DIR = Path(__file__).resolve().parent / "catalog"
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*$")


def spec_from_config(data: dict, name: str, source: str = "") -> ModelSpec | VisionSpec:
    """A token model's ModelSpec, or an image classifier's VisionSpec (models/vision.py) by model_type."""
    if isinstance(data, dict) and data.get("model_type") in VISION_TYPES:
        return vision_spec(data, name, source=source)
    return _text_spec(data, name, source=source)


# ---- catalog -------------------------------------------------------------------------------


def _read_json(path: Path, what: str) -> dict:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e.strerror or e}") from None
    return loads_config(data, f"{what} {path}")


@lru_cache(maxsize=1)
def _catalog() -> tuple[dict[str, dict], dict[str, str], dict[str, str]]:
    """(entries by name, lookup key -> name, hf_id lower -> name). Keys are lowercase."""
    entries: dict[str, dict] = {}
    keys: dict[str, str] = {}
    hub: dict[str, str] = {}
    for path in sorted(CATALOG_DIR.glob("*.json")):
        data = _read_json(path, "catalog file")
        meta = data.get("_trainfit")
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
            raise ConfigError(f"catalog file {path} has no '_trainfit.name'")
        name = meta["name"].lower()
        for key in [name, *(a.lower() for a in meta.get("aliases", []))]:
            if key in keys and keys[key] != name:
                raise ConfigError(f"catalog: '{key}' names both {keys[key]} and {name}")
            keys[key] = name
        entries[name] = data
        if meta.get("hf_id"):
            hub[meta["hf_id"].lower()] = name
    return entries, keys, hub


def catalog_names(include_aliases: bool = False) -> list[str]:
    """Catalog names (and aliases), sorted."""
    entries, keys, _ = _catalog()
    return sorted(keys if include_aliases else entries)


def _catalog_spec(name: str) -> ModelSpec:
    data = _catalog()[0][name]
    meta = data["_trainfit"]
    src = f"trainfit catalog ({meta['hf_id']})" if meta.get("hf_id") else "trainfit catalog"
    return spec_from_config(data, meta["name"], source=src)


def _lookup(ref: str) -> str | None:
    return _catalog()[1].get(ref.strip().lower())


def catalog_entry(name: str) -> dict:
    """The `_trainfit` metadata (name, aliases, hf_id, source, params_published, ...) of a catalog
    model, by name or alias (case-insensitive)."""
    key = _lookup(name)
    if key is None:
        raise UnknownModelError(_unknown_message(name))
    return dict(_catalog()[0][key]["_trainfit"])


def list_models() -> list[ModelSpec]:
    """Every catalog model, ordered by family (HF model_type) then total parameters."""
    specs = [_catalog_spec(n) for n in _catalog()[0]]
    return sorted(specs, key=lambda s: (s.family, s.name))


# ---- local files and the HF cache -----------------------------------------------------------


def _load_path(path: Path) -> ModelSpec:
    if path.is_dir():
        cfg = path / "config.json"
        if not cfg.is_file():
            raise ConfigError(f"folder {path} holds no config.json; pass the path to a model's config.json")
        path = cfg
    data = _read_json(path, "config file")
    name = path.parent.name if path.name == "config.json" else path.stem
    return spec_from_config(data, name or str(path), source=str(path))


def hf_cache_dirs() -> list[Path]:
    """Candidate HF hub cache folders, in huggingface_hub's order of precedence."""
    env = os.environ
    dirs: list[Path] = []
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(var):
            dirs.append(Path(env[var]).expanduser())
    if env.get("HF_HOME"):
        dirs.append(Path(env["HF_HOME"]).expanduser() / "hub")
    xdg = env.get("XDG_CACHE_HOME")
    if xdg:
        dirs.append(Path(xdg).expanduser() / "huggingface" / "hub")
    dirs.append(Path("~/.cache/huggingface/hub").expanduser())
    seen: list[Path] = []
    for d in dirs:
        if d not in seen:
            seen.append(d)
    return seen


def find_cached_config(hub_id: str) -> Path | None:
    """config.json of `org/name` in the local HF cache: the snapshot refs/main points at, else the
    newest snapshot holding a config.json; None when not cached."""
    folder = "models--" + hub_id.replace("/", "--")
    for cache in hf_cache_dirs():
        repo = cache / folder
        snaps = repo / "snapshots"
        if not snaps.is_dir():
            continue
        ref = repo / "refs" / "main"
        if ref.is_file():
            rev = ref.read_text(encoding="utf-8").strip()
            cfg = snaps / rev / "config.json"
            if cfg.is_file():
                return cfg
        found = [p for p in snaps.glob("*/config.json") if p.is_file()]
        if found:
            return max(found, key=lambda p: p.stat().st_mtime)
    return None


def _unknown_message(ref: str) -> str:
    keys = catalog_names(include_aliases=True) + vision_names()
    close = difflib.get_close_matches(ref.strip().lower(), keys, n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(close)}?" if close else ""
    return (
        f"unknown model '{ref}'.{hint} Run `trainfit models` to list the catalog, "
        "or pass the path to a config.json."
    )


def _looks_like_path(ref: str) -> bool:
    return (
        ref.endswith(".json")
        or ref.startswith(("/", "./", "../", "~", "."))
        or os.sep in ref and not _HUB_ID.match(ref)
        or (os.altsep is not None and os.altsep in ref)
    )


def load_model(ref: str) -> ModelSpec | VisionSpec:
    """Resolve a catalog name/alias, a config.json path or folder, or a cached HF hub id."""
    if not isinstance(ref, str) or not ref.strip():
        raise UnknownModelError("no model given: pass a catalog name (see `trainfit models`) or a config.json path")
    ref = ref.strip()
    path = Path(ref).expanduser()
    # A local config.json (or a folder holding one) wins, as in transformers' from_pretrained.
    if path.is_file() or (path.is_dir() and (path / "config.json").is_file()):
        return _load_path(path)
    name = _lookup(ref)
    if name is not None:
        return _catalog_spec(name)
    vision = vision_lookup(ref)  # the vision catalog (models/catalog/vision), names and hub ids
    if vision is not None:
        return vision_catalog_spec(vision)
    if path.is_dir():
        return _load_path(path)  # raises: the folder holds no config.json
    if _looks_like_path(ref):
        raise ConfigError(f"no such file or folder: {ref}")
    if _HUB_ID.match(ref):
        cfg = find_cached_config(ref)
        if cfg is not None:
            data = _read_json(cfg, "config file")
            return spec_from_config(data, ref.split("/", 1)[1], source=f"{ref} (HF cache: {cfg})")
        hub_name = _catalog()[2].get(ref.lower())
        if hub_name is not None:
            return _catalog_spec(hub_name)
        raise UnknownModelError(
            f"'{ref}' is not in the local HF cache ({hf_cache_dirs()[0]}) nor in the catalog; trainfit works "
            "offline: download its config.json and pass its path (e.g. `trainfit estimate ./config.json`)."
        )
    raise UnknownModelError(_unknown_message(ref))
