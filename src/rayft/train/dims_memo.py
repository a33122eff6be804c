"""The memory planner's model sizes (:class:`rayft.train.memory_plan.ModelDims`) remembered on disk,
by the model's config.

The planner counts parameters on the model built on the meta device, which imports the model's
transformers modules: 3.1 s of the 3.7 s a first :func:`~rayft.train.memory_plan.model_dims` took on
the 2-core development machine (Qwen2), and on a GPU host the driver pays it between Ray's start and
the workers' (``rayft train``'s ``checks`` phase; bench/NOTES.md §41). The sizes depend only on the
config and the transformers release that builds the model, so a run of a model the host has planned
before reads them back.

One JSON file per key under ``$RAYFT_CACHE/model-dims`` (default ``~/.cache/rayft``); the key is the
sha256 of the config's full JSON (which names its transformers version), the installed transformers
version, and :class:`ModelDims`'s field names. Not remembered: models with their own code
(``auto_map``: ``trust_remote_code``), whose modules can change under one config. A memo that cannot
be read, parsed or written is only a miss: the sizes are counted again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

#: bumped when what a ModelDims' fields mean changes (their names are in the key already)
MEMO_VERSION = 1


def memo_dir() -> Path:
    """``$RAYFT_CACHE/model-dims`` (default ``~/.cache/rayft/model-dims``)."""
    return Path(os.environ.get("RAYFT_CACHE") or Path.home() / ".cache" / "rayft") / "model-dims"


def memo_key(conf, dims_type: type) -> str | None:
    """The key of a transformers config's sizes (hex sha256), or None where they are not remembered:
    a model with its own code (``auto_map``), or a config that does not serialize."""
    import transformers

    if getattr(conf, "auto_map", None):
        return None
    try:
        spec = conf.to_json_string(use_diff=False)
    except (TypeError, ValueError):
        return None
    fields = [f.name for f in dataclasses.fields(dims_type)]
    blob = json.dumps([MEMO_VERSION, transformers.__version__, fields, spec])
    return hashlib.sha256(blob.encode()).hexdigest()


def recall(key: str, dims_type: type):
    """The sizes remembered under ``key`` (a ``dims_type``), or None: none, or unreadable."""
    try:
        values: dict[str, Any] = json.loads((memo_dir() / f"{key}.json").read_text())
        if "param_shapes" in values:
            values["param_shapes"] = tuple(tuple(s) for s in values["param_shapes"])
        return dims_type(**values)
    except (OSError, ValueError, TypeError):
        return None


def remember(key: str, dims) -> None:
    """Write ``dims`` under ``key`` (atomically: a temporary file, then a rename); errors are ignored."""
    path = memo_dir() / f"{key}.json"
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(dataclasses.asdict(dims)))
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
