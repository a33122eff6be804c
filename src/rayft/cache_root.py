"""Where rayft keeps what it caches on a host: ``$RAYFT_CACHE``, default ``~/.cache/rayft``."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$RAYFT_CACHE`` (``~`` expanded; unset or empty: ``~/.cache/rayft``). The offline tokenizers
    (``tokenizers/``) and the planner's model sizes (``model-dims/``) live under it."""
    return Path(os.path.expanduser(os.environ.get("RAYFT_CACHE") or "~/.cache/rayft"))
