"""One worker without FSDP2: the fp32 master weights, and one low-precision copy of them to compute with.

FSDP2 over a single rank shards nothing, yet each step it still runs its all-gather and
reduce-scatter per decoder layer: the forward (and the resharded backward) casts the layer's fp32
weights into a bf16 buffer and copies them out, the backward copies the gradients into a reduce
buffer and back. On the 1.7B model on one H200 that was 21.3 ms of copies and casts in a 348.7 ms
step and 1.67× torchtitan's CUDA calls (bench/NOTES.md §24); torchtitan applies no FSDP on one GPU.

:class:`ComputeCopies` keeps the module's parameters as they are, fp32 and registered: the
optimizer, gradient clipping, checkpoints and the export see them, as they see FSDP2's shards
otherwise. Inside :meth:`ComputeCopies.computing` the module's parameter slots hold instead one
persistent copy of each in the compute dtype (bf16), whose gradient is added into its master's fp32
``.grad``, then freed: the same values and the same fp32 accumulation over micro-batches as FSDP2 on
one rank with ``reduce_dtype`` fp32. The gradients are moved in groups: each copy's
post-accumulate-grad hook only adds it to the group, and a group is moved when it holds
:data:`GRAD_GROUP_BYTES`, the rest when the backward ends (a callback the first hook queues with
autograd's engine, as FSDP2 queues its own). A move is a multi-tensor cast into fresh fp32 gradients
(the step's first micro-batch), or into an fp32 scratch then a multi-tensor add (the next ones). It replaced a cast launched by
each parameter's hook as autograd made its gradient: 313 kernels, 6.3 ms a step, on the 1.7B model
in bf16, and in float8, whose step waits on the host's launches, 463 copies (bench/NOTES.md §33).
The copies are cast again from the masters before a forward when a master
changed since the last cast as its version counter shows (a checkpoint's load, a weight load). The
fused AdamW step leaves the version counters as they were, so
:meth:`rayft.train.model.ShardedModel.after_optimizer_step` casts the copies at once
(:meth:`ComputeCopies.refresh`), queued behind the optimizer's kernels: the host's share of the
cast (a Python pass over every parameter, and the walk over the module's slots, kept for the next
forward) then runs while the device is busy, not at the next step's start with the device idle
(a gap of 4.1-4.5 ms in a 355 ms step under the profiler, bench/NOTES.md §33). What is left at a
block's start: the version counters' check and the swap of the slots.

Memory: the copies stay allocated, 2 bytes per parameter for bf16, where FSDP2 gathers two
decoder layers' at a time; the fp32 gradients are the same 4 bytes per parameter; a group's
gradients wait in bf16 until it is moved, at most :data:`GRAD_GROUP_BYTES` and the gradient that
filled it, and with grad accumulation a later micro-batch's group is cast into an fp32 scratch
(twice its bytes) before it is added (:func:`rayft.train.memory_plan.plan_memory` counts both). A
backward that raises must be followed by a new :meth:`ComputeCopies.computing` block (the step opens
one per micro-batch): its start drops what the failed backward left on the copies.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator

import torch
from torch._utils import _unflatten_dense_tensors
from torch.autograd import Variable

#: compute-dtype gradients gathered before they are moved into the masters' fp32 ones in one go
#: (bytes): fewer launches than one per parameter, without holding every gradient twice until the
#: backward ends (2 bytes per parameter more, 3 GB on the 1.5B preset)
GRAD_GROUP_BYTES = 256 * 2**20


class ComputeCopies:
    """Compute-dtype copies of ``module``'s parameters, swapped into its slots by :meth:`computing`.

    ``dtype``: the compute dtype (``torch.bfloat16``). Parameters shared by several modules (tied
    embeddings) get one copy, in every slot they hold. Not thread-safe; one per module.
    """

    def __init__(self, module: torch.nn.Module, dtype: torch.dtype):
        self.module, self.dtype = module, dtype
        self.copy_of: dict[int, tuple[torch.nn.Parameter, torch.nn.Parameter]] = {}  # id(master) → (master, copy)
        self.synced: tuple[tuple[int, int, bool], ...] | None = None  # (id, version, requires_grad) of each master at the last cast
        self.swapped: list[tuple[torch.nn.Module, str, torch.nn.Parameter]] = []  # (module, slot, master) while computing
        self.next_slots: list[tuple[torch.nn.Module, str, torch.nn.Parameter]] | None = None  # refresh's walk, for the next block
        self.group: list[tuple[torch.nn.Parameter, torch.nn.Parameter]] = []  # (master, copy) whose gradient waits to be moved
        self.group_bytes = 0
        self.move_queued_in: int | None = None  # the autograd graph task whose end moves the last group (see _gradient_made)
        self.moves_queued = 0  # end-of-backward moves queued and not run: above 0 at a block's start, a backward raised

    def refresh(self) -> None:
        """Cast every copy from its master now (making any copy that is missing), whatever the
        version counters say: after an optimizer step, before the host waits for the device. The
        walk over the module's slots is kept for the next :meth:`computing` block, whose start then
        only checks the version counters.

        Raises:
            RuntimeError: called inside a :meth:`computing` block (the slots hold the copies).
        """
        if self.swapped:
            raise RuntimeError("ComputeCopies.refresh inside a computing() block: the slots hold the copies, not the masters")
        self.next_slots = self._slots()
        self.synced = None
        self._refresh(self._distinct(self.next_slots))

    def copy_for(self, master: torch.nn.Parameter) -> torch.nn.Parameter | None:
        """``master``'s compute copy (None: it has none yet, or one whose ``requires_grad`` differs,
        which the next :meth:`computing` block replaces)."""
        kept = self.copy_of.get(id(master))
        return kept[1] if kept is not None and kept[0] is master and kept[1].requires_grad == master.requires_grad else None

    def copies_written(self) -> None:
        """The optimizer's step wrote every stepped master's copy (:class:`rayft.train.copying_adamw.CopyingAdamW`)
        without changing the masters' version counters: the copies stay recorded as cast, as
        :meth:`refresh` records its own cast, where the masters are as at the last cast (the same
        versions; the masters it did not step did not change). Where a master has no copy, or was
        written since that cast by anything else, nothing is recorded, and the next
        :meth:`computing` block casts them all."""
        self.next_slots = self._slots()
        masters = self._distinct(self.next_slots)
        signature = tuple((id(p), p._version, p.requires_grad) for p in masters)
        ready = signature == self.synced and all(self.copy_for(p) is not None for p in masters)
        self.synced = signature if ready else None

    def release(self) -> None:
        """Free the copies (2 bytes per parameter for bf16), e.g. before the export's logit check
        needs the room; a later :meth:`computing` makes them again."""
        self.copy_of, self.synced, self.next_slots = {}, None, None
        self.group.clear()
        self.group_bytes, self.moves_queued, self.move_queued_in = 0, 0, None

    @contextlib.contextmanager
    def computing(self) -> Iterator[None]:
        """The module computes with the copies inside this block (forward, and backward, whose
        activation checkpointing runs the forward again); re-entrant: an inner block changes nothing.
        On leaving, the slots hold the masters again, with the block's gradients in their ``.grad``."""
        if self.swapped:
            yield
            return
        slots, self.next_slots = self.next_slots or self._slots(), None  # refresh's walk serves one block
        if self.moves_queued:  # a backward that raised left part of its gradients on the copies: not the next one's
            self.drop_grads()
        self._refresh(self._distinct(slots))
        try:
            for mod, name, p in slots:
                mod._parameters[name] = self.copy_of[id(p)][1]
            self.swapped = slots
            yield
        finally:
            for mod, name, p in slots:
                mod._parameters[name] = p
            self.swapped = []

    def _slots(self) -> list[tuple[torch.nn.Module, str, torch.nn.Parameter]]:
        """Every (module, slot name, parameter) of the module, a shared parameter once per slot."""
        return [(mod, name, p) for mod in self.module.modules() for name, p in mod._parameters.items() if p is not None]

    @staticmethod
    def _distinct(slots: list[tuple[torch.nn.Module, str, torch.nn.Parameter]]) -> list[torch.nn.Parameter]:
        """The distinct parameters of ``slots`` in slot order (a shared one once)."""
        return list({id(p): p for _m, _n, p in slots}.values())

    def _refresh(self, masters: list[torch.nn.Parameter]) -> None:
        """Make a copy for each new master (or one whose ``requires_grad`` changed: its copy's hook
        and flag follow it) and cast every copy again when any master changed."""
        signature = tuple((id(p), p._version, p.requires_grad) for p in masters)
        if signature == self.synced:
            return
        old = self.copy_of
        self.copy_of = {}
        for p in masters:
            kept = old.get(id(p))
            self.copy_of[id(p)] = kept if kept is not None and kept[1].requires_grad == p.requires_grad else (p, self._new_copy(p))
        copies = [self.copy_of[id(p)][1] for p in masters]
        with torch.no_grad():
            torch._foreach_copy_(copies, [p.detach() for p in masters])
        self.synced = signature

    def move_grads(self) -> None:
        """Hand the group's gradients to their masters' fp32 ``.grad`` and free them: cast into fresh
        fp32 tensors where a master has none (the step's first micro-batch), else cast into a scratch
        fp32 buffer and added to the master's (grad accumulation's later ones): a multi-tensor
        launch for each, where an add of bf16 into fp32 would take one kernel per tensor."""
        waiting = {id(c): (m, c) for m, c in self.group}  # a copy whose hook ran twice: moved once
        pairs = [(m, c, c.grad) for m, c in waiting.values() if c.grad is not None]
        self.group.clear()
        self.group_bytes = 0
        for _m, c, _g in pairs:
            c.grad = None
        fresh = [(m, g) for m, _c, g in pairs if m.grad is None]
        held = [(m, g) for m, _c, g in pairs if m.grad is not None]
        with torch.no_grad():
            if fresh:
                made = _uninitialised_like([m for m, _g in fresh])
                torch._foreach_copy_(made, [g for _m, g in fresh])
                for (m, _g), t in zip(fresh, made):
                    m.grad = t
            if held:
                scratch = _uninitialised_like([m for m, _g in held])  # 2 × the group's bytes, freed at once
                torch._foreach_copy_(scratch, [g for _m, g in held])
                torch._foreach_add_([m.grad for m, _g in held], scratch)

    def drop_grads(self) -> None:
        """Free the gradients a backward left on the copies without moving them (it raised before its
        end): the next backward's own must not be added to them, and an optimizer's ``zero_grad``
        sees only the masters'."""
        for _m, c in self.copy_of.values():
            c.grad = None
        self.group.clear()
        self.group_bytes, self.moves_queued, self.move_queued_in = 0, 0, None

    def _gradient_made(self, entry: tuple[torch.nn.Parameter, torch.nn.Parameter], nbytes: int) -> None:
        """A copy's post-accumulate-grad hook (``entry``: its master and itself; ``nbytes``: its
        gradient's size): add it to the group, move the group once it holds :data:`GRAD_GROUP_BYTES`;
        the first hook of each backward (each autograd graph task; a reentrant one nested in it counts
        apart) queues the last group's move for its end."""
        task = torch._C._current_graph_task_id()
        if task != self.move_queued_in:
            self.move_queued_in = task
            self.moves_queued += 1
            Variable._execution_engine.queue_callback(self._backward_ended)
        self.group.append(entry)
        self.group_bytes += nbytes
        if self.group_bytes >= GRAD_GROUP_BYTES:
            self.move_grads()

    def _backward_ended(self) -> None:
        self.moves_queued -= 1
        self.move_grads()

    def _new_copy(self, master: torch.nn.Parameter) -> torch.nn.Parameter:
        """An uninitialised compute-dtype parameter shaped as ``master``, whose gradients
        :meth:`move_grads` hands to ``master.grad`` (fp32)."""
        copy = torch.nn.Parameter(torch.empty_like(master, dtype=self.dtype), requires_grad=master.requires_grad)
        if master.requires_grad:
            copy.register_post_accumulate_grad_hook(_GradientHook(weakref.ref(self), master, copy.numel() * copy.element_size()))
        return copy


class _GradientHook:
    """A copy's post-accumulate-grad hook: tells its :class:`ComputeCopies` (held weakly) that the
    copy's gradient is made. It holds neither the copy nor its owner strongly: a reference from a
    tensor's hook back to them is a cycle Python's collector does not break, which would keep the
    module and its copies alive after the model is dropped (a review found it in a first version)."""

    def __init__(self, owner: weakref.ref, master: torch.nn.Parameter, nbytes: int):
        self.owner, self.master, self.nbytes = owner, master, nbytes

    def __call__(self, copy: torch.Tensor) -> None:
        owner = self.owner()
        if owner is not None:
            owner._gradient_made((self.master, copy), self.nbytes)


def _uninitialised_like(masters: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    """Uninitialised tensors shaped, typed and placed as ``masters``: views of one buffer (one
    allocation and one C++ call: half the host time of a ``torch.empty`` each,
    bench/compute_copy_grads.py) where they share a dtype and device and are contiguous; else one
    each, with the master's strides."""
    first = masters[0]
    if all(m.dtype == first.dtype and m.device == first.device and m.is_contiguous() for m in masters):
        flat = torch.empty(sum(m.numel() for m in masters), dtype=first.dtype, device=first.device)
        return list(_unflatten_dense_tensors(flat, masters))
    return [torch.empty_strided(m.shape, m.stride(), dtype=m.dtype, device=m.device) for m in masters]
