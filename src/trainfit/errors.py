"""Errors a user can cause. The CLI prints the message on one line and exits with code 2."""


class TrainfitError(Exception):
    """Base class: the message says what is wrong and how to fix it."""


class UnknownModelError(TrainfitError):
    pass


class UnknownGPUError(TrainfitError):
    pass


class GPUFileError(TrainfitError):
    """A --gpu file (JSON/TOML with the catalog's fields) that is missing, unreadable or has a bad field."""


class ConfigError(TrainfitError):
    """A config.json that cannot be read or describes something we do not support."""


class SetupError(TrainfitError):
    """An impossible setup: sizes <= 0, a parallel layout that does not divide the model, ..."""


class NotModelledError(SetupError):
    """A setup whose terms the analytic engine has not derived (the trace engine runs it): refused in one line like any
    SetupError; the planner leaves such layouts out and says so (plan/search.py)."""


class EngineUnavailableError(TrainfitError):
    pass


class SnapshotError(TrainfitError):
    """A memory snapshot file (`trainfit explain`) that is missing, not a pickle, or not torch's snapshot format."""
