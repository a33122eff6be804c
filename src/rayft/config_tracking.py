"""The ``tracking:`` config section: where the driver sends each step's metrics besides
``rayft_metrics.jsonl`` (TensorBoard, MLflow, Weights & Biases; :mod:`rayft.tracking` does it).

Secrets never live in the config file (it is copied into the run directory and logged as
parameters): MLflow reads ``MLFLOW_TRACKING_TOKEN`` or ``MLFLOW_TRACKING_USERNAME`` /
``MLFLOW_TRACKING_PASSWORD``, W&B ``WANDB_API_KEY``, from the environment. A key under
``tracking`` that names a secret is refused by :func:`secret_key_hint` (an unknown key whose
error says which variable to set), and an MLflow URI holding a password is refused.
"""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import ConfigDict, Field, model_validator

from rayft.config_base import ConfigModel

#: where each tracker reads its secrets (documented in docs/tracking.md)
SECRET_ENV = {
    "mlflow": "MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD",
    "wandb": "WANDB_API_KEY",
}
_SECRET_WORDS = re.compile(r"key|token|secret|passw|pwd|credential|auth|username", re.IGNORECASE)


class _Section(ConfigModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class MlflowConfig(_Section):
    """``tracking.mlflow``: an MLflow tracking server (``http://host:5000``), a local store
    (``file:./mlruns``, ``sqlite:///mlflow.db``) or ``databricks``."""

    tracking_uri: str = Field(min_length=1, description="MLflow tracking URI; credentials come from the environment.")
    experiment: str = Field(default="rayft", min_length=1, description="Experiment name (created when missing).")
    run_name: str | None = Field(default=None, description="Default: the rayft run's name (checkpoint.name).")

    @model_validator(mode="before")
    @classmethod
    def _no_password_in_uri(cls, data: Any) -> Any:
        uri = data.get("tracking_uri") if isinstance(data, dict) else None
        if isinstance(uri, str) and "://" in uri:
            try:
                has_password = urlsplit(uri).password is not None
            except ValueError:
                has_password = False
            if has_password:  # the error names no value: the password stays out of the message
                raise ValueError(
                    f"tracking_uri holds a password: give the URI without it and set {SECRET_ENV['mlflow']} in the environment"
                )
        return data


class WandbConfig(_Section):
    """``tracking.wandb``: a Weights & Biases project; ``mode: offline`` writes the run under
    ``RUN_DIR/wandb`` for a later ``wandb sync``."""

    project: str = Field(min_length=1)
    mode: Literal["online", "offline"] = "online"
    entity: str | None = None
    run_name: str | None = Field(default=None, description="Default: the rayft run's name (checkpoint.name).")


class TrackingConfig(_Section):
    """``tracking``: any of ``tensorboard: true`` (event files in ``RUN_DIR/tensorboard``),
    ``mlflow: {...}`` (:class:`MlflowConfig`) and ``wandb: {...}`` (:class:`WandbConfig`). The
    driver alone logs; a tracker it cannot reach is a warning, never a failed run."""

    tensorboard: bool = False
    mlflow: MlflowConfig | None = None
    wandb: WandbConfig | None = None

    def enabled(self) -> list[str]:
        """The trackers turned on, in logging order."""
        return [n for n, on in (("tensorboard", self.tensorboard), ("mlflow", self.mlflow), ("wandb", self.wandb)) if on]


def secret_key_hint(loc: tuple[Any, ...]) -> str | None:
    """For an unknown key at ``loc`` under ``tracking`` whose name looks like a secret
    (``api_key``, ``token``, ``password``…): the message that refuses it and names the
    environment variable to set instead; None otherwise."""
    if len(loc) < 2 or loc[0] != "tracking" or not isinstance(loc[-1], str) or not _SECRET_WORDS.search(loc[-1]):
        return None
    env = SECRET_ENV.get(str(loc[1]), " or ".join(SECRET_ENV.values()))
    return f"secrets are not read from the config file (it is copied into the run directory and logged): set {env} in the environment"
