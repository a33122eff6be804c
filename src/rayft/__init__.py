"""rayft: full-parameter fine-tuning of open LLMs with FSDP2 through Ray Train."""

__version__ = "0.1.0"
