"""The nccl layer's one error type."""

from __future__ import annotations

__all__ = ["DoctorError"]


class DoctorError(RuntimeError):
    """What the doctor was asked to judge cannot be read (a Ray job's logs, a run directory,
    flight-recorder dumps); the message says what to do next."""
