"""The independent reference for validation losses: a plain single-process forward, one example at a time."""

import torch
import torch.nn.functional as F

from rayft.data.packing import IGNORE_INDEX, collate


def single_process_loss(model, ds, seq_len: int, rows: list[list[int]] | None = None) -> tuple[float, int]:
    """Mean CE (float64) of ``model`` (a transformers causal LM) over every trainable target of
    ``ds`` (a tokenized dataset), one row at a time, one process: ``(the mean, the number of
    targets)``. ``rows``: the rows' example indices (e.g. a step's rows); default one row per example."""
    total, count = 0.0, 0
    with torch.no_grad():
        for row in rows if rows is not None else [[i] for i in range(len(ds))]:
            b = collate(ds, [row], seq_len, 0, fixed_len=False)  # one row, no padding: the pad id is unused
            logits = model(input_ids=b["input_ids"], position_ids=b["position_ids"]).logits
            total += F.cross_entropy(
                logits.flatten(0, 1).double(), b["labels"].flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
            ).item()
            count += int(b["num_trainable"])
    return total / count, count
