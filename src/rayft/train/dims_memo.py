"""The memory planner's model sizes (:class:`rayft.train.memory_plan.ModelDims`) remembered on disk,
by the model's config.

The planner counts parameters on the model built on the meta device, which imports the model's
transformers modules: 3.1 s of the 3.7 s a first :func:`~rayft.train.memory_plan.model_dims` took on
the 2-core development machine (Qwen2), and on a GPU host the driver pays it between Ray's start and
the workers' (``rayft train``'s ``checks`` phase; bench/NOTES.md §41). The sizes depend only on the
config, the transformers release that builds the model and rayft's counting code, so a run of a
model the host has planned before reads them back.

One JSON file per key in ``$RAYFT_DIMS_MEMO`` (a directory; ``off`` turns the memo off; default
``$RAYFT_CACHE/model-dims``, ``$RAYFT_CACHE`` defaulting to ``~/.cache/rayft``). The key is the
sha256 of the config's full JSON (which names its transformers version), the installed transformers
version, :class:`ModelDims`'s field names and the source of the functions that count. Not
remembered: configs that name their own code (``auto_map``), whose modules can change under one
config. The memo is only a shortcut: one that cannot be found, read, parsed or written, or whose
sizes do not add up, is a miss, and the sizes are counted again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rayft.cache_root import cache_root

#: bumped when what a ModelDims' fields mean changes (their names and the counting code are in the key already)
MEMO_VERSION = 1


def memo_dir() -> Path | None:
    """Where the memo lives: ``$RAYFT_DIMS_MEMO``, else ``$RAYFT_CACHE/model-dims`` (default
    ``~/.cache/rayft/model-dims``); None with ``RAYFT_DIMS_MEMO=off``.

    Raises:
        RuntimeError: no home directory to default to (``Path.home``).
    """
    where = os.environ.get("RAYFT_DIMS_MEMO")
    if where == "off":
        return None
    if where:
        return Path(os.path.expanduser(where))
    return cache_root() / "model-dims"


def memo_key(conf, dims_type: type, counted_by: Sequence[Callable]) -> str | None:
    """The key of a transformers config's sizes (hex sha256), or None where they are not remembered:
    a config that names its own code (``auto_map``), or one that does not serialize.
    ``counted_by``: the functions that count the sizes (their source is part of the key)."""
    import transformers

    if getattr(conf, "auto_map", None):
        return None
    try:
        spec = conf.to_json_string(use_diff=False)
        code = [inspect.getsource(f) for f in counted_by]
    except Exception:  # noqa: BLE001 - only a shortcut: counted as before
        return None
    fields = [f.name for f in dataclasses.fields(dims_type)]
    blob = json.dumps([MEMO_VERSION, transformers.__version__, fields, code, spec])
    return hashlib.sha256(blob.encode()).hexdigest()


def recall(key: str, dims_type: type):
    """The sizes remembered under ``key`` (a ``dims_type``), or None: none, unreadable, or sizes
    that do not add up (``params`` ≠ ``params_layer`` × ``layers`` + ``params_root``)."""
    try:
        where = memo_dir()
        if where is None:
            return None
        values: dict[str, Any] = json.loads((where / f"{key}.json").read_text())
        values["param_shapes"] = tuple(tuple(s) for s in values["param_shapes"])
        dims = dims_type(**values)
        if dims.params != dims.params_layer * dims.layers + dims.params_root:
            return None
        return dims
    except Exception:  # noqa: BLE001 - only a shortcut: counted again
        return None


def remember(key: str, dims) -> None:
    """Write ``dims`` under ``key`` (a temporary file of its own, then a rename); errors are ignored."""
    tmp = None
    try:
        where = memo_dir()
        if where is None:
            return
        where.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=where, prefix=f".{key}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(dataclasses.asdict(dims)))
        os.replace(tmp, where / f"{key}.json")
        tmp = None
    except Exception:  # noqa: BLE001 - only a shortcut: the next plan counts again
        pass
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
