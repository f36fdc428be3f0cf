"""THE one definition of a run's settings (no torch).

Each setting is declared once, here, with its type, default, help text, allowed values, bounds and the modes it
applies to. Everything else is generated from these declarations:
  * `Setup`  — how the model is run (what the engines read);
  * `Request` — a model plus every setting, flat (the Python API's, CLI's and web API's view), built by
    `make_request_class` (request.py);
  * the CLI options of every command (trainfit.cli.options), the web form and the web API's schema (trainfit.web).
Adding a setting = one field in settings.py (plus the formula that uses it).

Validation happens once, in `validate` (rules.py): positive integers, finite numbers within bounds, allowed choices, and
flags that do not apply to the mode (refused, never silently ignored).
"""
from __future__ import annotations

from .vocab import *  # noqa: F401,F403
from .parsers import (check_lora_targets, check_pp_split, check_recompute, combine_offload,  # noqa: F401
                      lora_target_names, parse_pp_split)
from .settings import (BY_NAME, SETTINGS, SETUP_NAMES, Meta, RunSettings, Setting, Setup, check_value,  # noqa: F401
                       choices_for, parse_value, refuse_inapplicable, refuse_unread, refuse_written, setting,
                       settings)
from .rules import micro_batch_rules, trains_any, validate  # noqa: F401
from .request import (GPU_SETTINGS, MODEL_SETTINGS, Request, default_seq, make_request_class, run_settings,  # noqa: F401
                      serve_dtype)
