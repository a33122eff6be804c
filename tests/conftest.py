"""Shared test helpers: where ../shared is, and the offline Qwen2.5 tokenizer (built once)."""

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def shared_path(*parts: str) -> Path:
    """A path under ../shared, or skip the test with a clear message when shared/ is absent."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"needs {p} (the project's ../shared folder), which is absent here")
    return p


@pytest.fixture(scope="session")
def qwen_tokenizer():
    from rayft.data.tokenizer import load_tokenizer

    return load_tokenizer("qwen2.5")
