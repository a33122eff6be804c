"""rayft: full-parameter fine-tuning of open LLMs with FSDP2 through Ray Train."""

__version__ = "0.1.0"


def _quiet_torchao() -> None:
    """torchao (imported by transformers when installed) logs a warning for each of its compiled
    extensions built for another CUDA or Python (``Failed to load ....so``) on every import, and
    torch 2.13 one for each Enum torchao 0.18 registers with pytree (``... is an Enum subclass and is
    now natively supported ...``): neither is a problem for anything rayft runs (float8 training
    uses torchao's Python path), so those lines are dropped."""
    import logging

    logging.getLogger("torchao").addFilter(lambda rec: not rec.getMessage().startswith("Failed to load "))
    logging.getLogger("torch.utils._pytree").addFilter(
        lambda rec: "is an Enum subclass and is now natively supported" not in rec.getMessage()
    )


_quiet_torchao()
