"""The one error type of the test control plane."""

from __future__ import annotations


class ControlPlaneError(RuntimeError):
    """The control plane could not be built, started or reached; the message says why."""
