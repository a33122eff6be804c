"""rayft: full-parameter fine-tuning of open LLMs with FSDP2 through Ray Train."""

__version__ = "0.1.0"


def _quiet_torchao() -> None:
    """torchao (imported by transformers when installed) logs a warning for each of its compiled
    extensions built for another CUDA or Python (``Failed to load ....so``) on every import: not a
    problem for anything rayft runs (float8 training uses its Python path), so those lines are dropped."""
    import logging

    logging.getLogger("torchao").addFilter(lambda rec: not rec.getMessage().startswith("Failed to load "))


_quiet_torchao()
