"""Model references -> ModelSpec, fully offline, standard library only (no torch, no transformers,
no huggingface_hub: `trainfit estimate` must start in well under a second).

A reference is, in the order tried:
1. a path to a config.json, or to a folder holding one;
2. a catalog name or alias (case-insensitive), e.g. "llama-3.1-8b", "gpt2-small", or the vision catalog's;
3. an HF hub id "org/name", read from the local HF cache
   (HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub,
   ~/.cache/huggingface/hub; layout models--org--name/snapshots/<rev>/config.json),
   else the catalog entry whose hf_id matches.

Every field that names a model (the model, and the settings marked `names_model` in trainfit.setup) is resolved by
`locate`, the one place a reference may reach the file system. Under `catalog_only()` (the web app, for every
request that computes) it takes catalog names, aliases and the hub ids the catalogs know, and nothing else, without
looking at the disk: no file is read, stat'ed or listed on a request's say-so (hardware.resolve_gpu obeys the same
rule for GPUs).

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
import stat
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

from trainfit.errors import ConfigError, UnknownModelError
from trainfit.references import NAME_MAX, catalog_only_rule, check_name, flag_of, shown
from trainfit.models.hf_config import loads_config
from trainfit.models.hf_config import spec_from_config as _text_spec
from trainfit.models.vision import (VISION_TYPES, vision_catalog_spec, vision_entry, vision_lookup, vision_names,
                                    vision_spec)
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


def _kind(path: Path) -> str | None:
    """"file" (a regular file), "dir", "other" (a device, a pipe: never opened) or None when nothing is there."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:  # a permission, a symlink loop
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None
    return "file" if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode) else "other"


def _load_path(cfg: Path) -> ModelSpec:
    data = _read_json(cfg, "config file")
    name = cfg.parent.name if cfg.name == "config.json" else cfg.stem
    return spec_from_config(data, name or str(cfg), source=str(cfg))


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
    newest snapshot holding a config.json; None when not cached (and always under catalog_only)."""
    if catalog_only_rule() is not None or not _HUB_ID.match(hub_id):
        return None
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


def _close_hint(ref: str) -> str:
    keys = catalog_names(include_aliases=True) + vision_names()
    close = difflib.get_close_matches(ref.strip().lower()[:NAME_MAX], keys, n=3, cutoff=0.5)
    return f" Did you mean {' or '.join(close)}?" if close else ""


def _unknown_message(ref: str, field: str = "model") -> str:
    return (f"{flag_of(field)} {shown(ref)}: unknown model.{_close_hint(ref)} Run `trainfit models` to list the "
            "catalog, or pass the path to a config.json.")


def _looks_like_path(ref: str) -> bool:
    return (
        ref.endswith(".json")
        or ref.startswith(("/", "./", "../", "~", "."))
        or os.sep in ref and not _HUB_ID.match(ref)
        or (os.altsep is not None and os.altsep in ref)
    )


# ---- resolution -------------------------------------------------------------------------------------------------


class Found(NamedTuple):
    """Where a reference resolved."""

    kind: str  # "catalog", "vision" (the vision catalog), "cache" (a hub id's config.json in the HF cache), "file"
    key: str  # the catalog or vision name, the hub id, or the reference as given
    path: Path | None = None  # the config.json read ("cache", "file")


def _in_catalogs(ref: str, hub_ids: bool) -> Found | None:
    """A catalog name or alias, the vision catalog's names, aliases and hub ids, and (hub_ids) the catalog's."""
    name = _lookup(ref)
    if name is not None:
        return Found("catalog", name)
    vision = vision_lookup(ref)
    if vision is not None:
        return Found("vision", vision)
    name = _catalog()[2].get(ref.lower()) if hub_ids else None
    return Found("catalog", name) if name is not None else None


def locate(ref: str, field: str = "model") -> Found:
    """Where a reference resolves: the one place a model reference may reach the file system. `field` names the
    setting in messages (model, draft_model, ...)."""
    if not isinstance(ref, str) or not ref.strip():
        raise UnknownModelError(f"no {field} given: pass a catalog name (see `trainfit models`) or a config.json path")
    ref = ref.strip()
    rule = catalog_only_rule()
    if rule is not None:  # nothing but the catalogs: the answer never depends on the disk
        found = _in_catalogs(ref, hub_ids=True)
        if found is None:
            hint = "" if _looks_like_path(ref) else _close_hint(ref)
            raise UnknownModelError(f"{field} {shown(ref)}: unknown model; {rule.models}.{hint}")
        return found
    check_name(ref, field)
    path = Path(os.path.expanduser(ref))  # os.path's: an unknown ~user stays as written (pathlib's raises)
    kind = _kind(path)
    # A local config.json (or a folder holding one) wins, as in transformers' from_pretrained.
    if kind == "file":
        return Found("file", ref, path)
    if kind == "dir" and _kind(path / "config.json") == "file":
        return Found("file", ref, path / "config.json")
    found = _in_catalogs(ref, hub_ids=False)
    if found is not None:
        return found
    where = f"{flag_of(field)} {shown(ref)}"
    if kind == "dir":
        raise ConfigError(f"{where}: the folder holds no config.json; pass the path to a model's config.json")
    if kind == "other":
        raise ConfigError(f"{where} is not a regular file (a device or a pipe); pass the path to a model's "
                          "config.json")
    if _looks_like_path(ref):
        raise ConfigError(f"{where}: no such file or folder")
    if _HUB_ID.match(ref):
        cfg = find_cached_config(ref)
        if cfg is not None:
            return Found("cache", ref, cfg)
        found = _in_catalogs(ref, hub_ids=True)
        if found is not None:
            return found
        raise UnknownModelError(
            f"{where} is not in the local HF cache ({hf_cache_dirs()[0]}) nor in the catalog; trainfit works "
            "offline: download its config.json and pass its path (e.g. `trainfit estimate ./config.json`)."
        )
    raise UnknownModelError(_unknown_message(ref, field))


def load_model(ref: str, field: str = "model") -> ModelSpec | VisionSpec:
    """Resolve a catalog name/alias, a config.json path or folder, or a cached HF hub id (see `locate`)."""
    found = locate(ref, field)
    if found.kind == "catalog":
        return _catalog_spec(found.key)
    if found.kind == "vision":
        return vision_catalog_spec(found.key)
    if found.kind == "cache":
        data = _read_json(found.path, "config file")
        return spec_from_config(data, found.key.split("/", 1)[1], source=f"{found.key} (HF cache: {found.path})")
    return _load_path(found.path)


def serving_ref(ref: str, field: str = "model") -> str:
    """What a serving engine's model argument takes for a reference (vLLM's --model, SGLang's --model-path: a hub
    id or a local folder holding config.json and the weights): the hub id of a catalog model (its name when it has
    none), a hub id as given, else the absolute path of the folder holding the config.json, so the command works
    from any directory."""
    found = locate(ref, field)
    if found.kind == "catalog":
        return _catalog()[0][found.key]["_trainfit"].get("hf_id") or found.key
    if found.kind == "vision":
        return vision_entry(found.key).get("hf_id") or found.key
    if found.kind == "cache":
        return found.key
    if found.path.name != "config.json":  # the engines read <folder>/config.json (transformers' AutoConfig)
        raise ConfigError(f"{field} {shown(ref)}: a serving engine loads a folder holding config.json and the "
                          f"weights, and {found.path.name} is not named config.json: rename it in its model's folder")
    return os.path.abspath(found.path.parent)
