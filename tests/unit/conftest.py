"""Unit tests run without Ray up in their process (an integration module before them in the same
pytest process may have left the shared embedded Ray up: see tests/conftest.py)."""

import pytest


@pytest.fixture(scope="module", autouse=True)
def no_embedded_ray(embedded_ray):
    embedded_ray.stop()
