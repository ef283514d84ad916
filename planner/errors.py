"""The errors every app turns into one line and exit code 2 (:func:`planner.apps.common.cli_errors`)."""

from __future__ import annotations

__all__ = ["UserError", "JobFailed"]


class UserError(ValueError):
    """Bad input from the user: reported as one line, exit code 2."""


class JobFailed(RuntimeError):
    """Bad input in one job of a sweep (``-m``): Hydra records that job as failed and runs the others."""
