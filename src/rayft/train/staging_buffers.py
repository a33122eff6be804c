"""Host buffers for async checkpoint saves, allocated off the step loop.

An async save first copies the rank's state (fp32 weights and AdamW's two moments: 12 bytes per
parameter of its shard) from the GPU into host memory, then writes from there in the background.
DCP's stager (``FileSystemWriter(cache_staged_state_dict=True)``) keeps that host copy in pinned
memory and reuses it, allocating it at its first ``stage()``: a copy of every DTensor into pageable
memory, then pinned buffers. rayft used to call that once after step 1, and for the 1.5B preset's
18.5 GB on one H200 the step loop stood still 36.9 s
(bench/results/2026-12-02-wall-time-cold-stopped-1xh200.json). :class:`BackgroundStaging`
allocates the same buffers on a thread while the steps run, with no copy, and the writer gets them
(its ``state_dict_cache``) at the first save, which waits only for what is not done yet.

Pinning on a thread needs PyTorch's host allocator set to register pages
(``pinned_use_cuda_host_register``, which rayft sets for its workers:
:func:`rayft.train.ray_cluster.pinned_register_conf`): its default, ``cudaHostAlloc``, holds the CUDA
driver's lock while it pins, and slowed the GPU work meanwhile 7.7× (registering: 1.06×;
bench/results/2026-12-02-staging-alloc-1xh200.json).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch
from torch.distributed.tensor import DTensor


def empty_host_like(state: Any, pin: bool) -> Any:
    """A host-memory twin of ``state`` for DCP's stager to copy into: the same nesting (dicts,
    lists, tuples), every tensor an uninitialised CPU tensor of its shape and dtype (a DTensor a
    DTensor of the same mesh and placements whose local shard is on the CPU), pinned when ``pin``
    (needs CUDA). As torch's own stager does: a 0-dim tensor (an optimizer's step count) becomes a
    zero CPU tensor and a 0-dim DTensor stays the live object itself; an empty tensor or local shard
    becomes zeros on the CPU, never pinned; every other value is kept as it is. No data is copied:
    the values are garbage until a save's staging copies into them. Reads shapes and dtypes only,
    so the loop may step meanwhile (AdamW adds no state entry after its first step).

    Raises:
        TypeError: a value of a type the stager cannot copy (not a tensor, number, string,
            bytes, None or container).
    """
    if isinstance(state, dict):
        return {k: empty_host_like(v, pin) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        out = [empty_host_like(v, pin) for v in state]
        return tuple(out) if isinstance(state, tuple) else out
    if isinstance(state, torch.Tensor):
        local = state.to_local() if isinstance(state, DTensor) else state
        if state.dim() == 0:
            return state if isinstance(state, DTensor) else torch.zeros((), dtype=state.dtype)
        if local.numel() == 0:
            return torch.zeros_like(state, device="cpu")
        # on a DTensor, empty_like runs on the local shard and keeps the mesh and placements
        return torch.empty_like(state, device="cpu", pin_memory=pin)
    if state is None or isinstance(state, (int, float, str, bytes)):
        return state
    raise TypeError(f"cannot stage a {type(state).__name__} for a checkpoint")


class BackgroundStaging:
    """:func:`empty_host_like` of a state dict (pinned unless ``pin`` is false: CPU-only hosts),
    run on a daemon thread from construction.

    :meth:`result` waits for it and returns the buffers, or raises the thread's error. The thread
    only allocates host memory; it launches no GPU work and reads no tensor's data, so the step
    loop may go on changing the state meanwhile.
    """

    def __init__(self, state: dict, pin: bool = True) -> None:
        self.started = time.perf_counter()
        self.finished: float | None = None  # perf_counter() when the buffers were ready
        self._buffers: dict | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(state, pin), name="rayft-staging-buffers", daemon=True)
        self._thread.start()

    def _run(self, state: dict, pin: bool) -> None:
        try:
            self._buffers = empty_host_like(state, pin)
        except BaseException as e:  # re-raised by result(), in the loop's thread
            self._error = e
        self.finished = time.perf_counter()

    def done(self) -> bool:
        """The thread has finished (the buffers are ready, or it failed)."""
        return not self._thread.is_alive()

    def result(self) -> dict:
        """Wait for the buffers. Raises the allocation's error (e.g. out of host memory)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._buffers is not None
        return self._buffers
