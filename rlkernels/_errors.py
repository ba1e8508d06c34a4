"""Exceptions raised by rlkernels."""


class BackendUnavailableError(RuntimeError):
    """An explicitly requested backend cannot run here (never silently replaced by another)."""
