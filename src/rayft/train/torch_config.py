"""Ray Train's ``TorchConfig`` for a rayft run: the CUDA device left alone until the data are checked.

Ray Train's own training-function context calls ``torch.cuda.set_device`` as each worker's function
starts, which makes the worker's CUDA context on its GPU. A rayft run's workers start while the
driver still reads and checks the data, then wait for their arguments (:mod:`rayft.train.worker_entry`),
so their GPUs stay untouched until the data's errors are known: no CUDA context exists before the
driver hands the arguments over. The loop sets the device itself (``rayft.train.loop.setup_worker``).
``train_func_context`` is ``BackendConfig``'s public hook; the process group is set up as Ray Train
sets it up (``dist.init_process_group``, which makes no CUDA context).

A module of its own: it imports Ray Train's torch backend (and torch), which the driver's modules
load only when a run reaches its workers; the controller unpickles the class from here by name.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from ray.train.torch import TorchConfig


@dataclass
class DeviceDeferredTorchConfig(TorchConfig):
    """``TorchConfig`` (``backend``: the process group's, e.g. ``nccl``, ``gloo`` or
    ``cpu:gloo,cuda:nccl``) without the CUDA device set around the training function."""

    @property
    def train_func_context(self):
        return contextlib.nullcontext
