"""The Hugging Face Hub when it cannot be reached: one line and the local cache, instead of
huggingface_hub's five retries (with their log lines) for every file of every load."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable


def hub_ids(names: Iterable[str | None]) -> list[str]:
    """The names that would be fetched from the Hub: not None, not a local path, not a preset, not
    one of the tokenizers built offline (:data:`rayft.data.tokenizer_names.OFFLINE_TOKENIZER_NAMES`:
    ``qwen2.5``, ``qwen3``, ``llama3``, ``mistral-v3``). Imports neither transformers nor torch."""
    from rayft.data.tokenizer_names import OFFLINE_TOKENIZER_NAMES
    from rayft.train.presets import is_preset

    return [n for n in names if n and n not in OFFLINE_TOKENIZER_NAMES and not is_preset(n) and not os.path.exists(n)]


def hub_unreachable(timeout_s: float = 5.0) -> str | None:
    """Why the Hub's endpoint (``HF_ENDPOINT``, default https://huggingface.co) cannot be reached
    (one request, no retry), or None when it answers (any HTTP status counts as an answer)."""
    from huggingface_hub import constants

    try:
        urllib.request.urlopen(urllib.request.Request(constants.ENDPOINT, method="HEAD"), timeout=timeout_s).close()
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError) as e:
        return str(getattr(e, "reason", e))
    return None


def offline_when_unreachable(names: Iterable[str | None], say: Callable[[str], None], probe=hub_unreachable) -> bool:
    """When some of ``names`` are Hub ids and the Hub cannot be reached (``probe``), switch this
    process (and the processes it starts) to offline mode (``HF_HUB_OFFLINE=1``: files come from
    the local cache, a missing one fails at once) and say so in one line; returns whether it did.
    Nothing is probed when ``HF_HUB_OFFLINE`` is already set or no name is a Hub id."""
    from huggingface_hub import constants

    ids = hub_ids(names)
    if not ids or constants.HF_HUB_OFFLINE:
        return False
    why = probe()
    if why is None:
        return False
    os.environ["HF_HUB_OFFLINE"] = "1"
    constants.HF_HUB_OFFLINE = True
    say(f"note: {constants.ENDPOINT} cannot be reached ({why}): {', '.join(ids)} from the local Hugging Face cache only (HF_HUB_OFFLINE=1)")
    return True
