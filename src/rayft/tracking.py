"""Experiment trackers fed by the driver: TensorBoard (tensorboardX), MLflow and Weights & Biases.

The driver receives every step's metrics record (the line of ``rayft_metrics.jsonl``) and hands it
to :class:`Trackers` (``log_step``); at the end the summary (``log_summary``) and the HF export
directory (``log_artifact``, MLflow only). Only the driver logs, so one process writes each
tracker's run whatever the number of workers.

A tracker never stops a run: one that cannot be started (a server not reached, a missing
package, a refused login) is one warning at start and is left out; one that fails later is one
warning and is then off. Each tracker is fed from its own thread, so a slow server never holds
the driver's progress loop (and its signal handling). ``rayft_metrics.jsonl`` stays the record.

Secrets come from the environment only (see :mod:`rayft.config_tracking`): the config holds none,
so the parameters logged (the flattened resolved config) hold none either.

Names logged (:data:`STEP_SCALARS`): ``train/loss``, ``train/lr``, ``train/grad_norm``,
``train/epoch``, ``perf/tokens_per_s_per_gpu``, ``perf/trainable_tokens_per_s_per_gpu``,
``perf/mfu`` (fraction, GPU runs), ``perf/peak_mem_gib`` (GPU runs), ``perf/step_time_s``,
``eval/loss``; x axis: the optimizer step. The summary's numbers go under ``summary/``.
"""

from __future__ import annotations

import json
import math
import os
import queue
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

from rayft.config import RayftConfig
from rayft.config_load import dump_config
from rayft.config_tracking import MlflowConfig, WandbConfig

#: step record key → tracker metric name (units as in ``rayft_metrics.jsonl``)
STEP_SCALARS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "epoch": "train/epoch",
    "tokens_per_s_per_gpu": "perf/tokens_per_s_per_gpu",
    "trainable_tokens_per_s_per_gpu": "perf/trainable_tokens_per_s_per_gpu",
    "mfu": "perf/mfu",
    "peak_mem_gib": "perf/peak_mem_gib",
    "step_time_s": "perf/step_time_s",
    "eval_loss": "eval/loss",
}
#: seconds a failed or stopped run waits for its trackers to send what is queued (a finished run waits for all)
CLOSE_WAIT_S = 10.0
MLFLOW_PARAM_MAX = 6000  # characters of one MLflow parameter value (longer ones are cut)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def step_scalars(record: dict) -> dict[str, float]:
    """The tracker metrics of one step record (:data:`STEP_SCALARS`; absent and None values left out)."""
    return {name: float(record[k]) for k, name in STEP_SCALARS.items() if _number(record.get(k))}


def summary_scalars(summary: dict) -> dict[str, float]:
    """The summary's numbers as ``summary/<key>`` (``wall_s`` parts as ``summary/wall_s/<part>``)."""
    out = {f"summary/{k}": float(v) for k, v in summary.items() if _number(v)}
    out |= {f"summary/wall_s/{k}": float(v) for k, v in (summary.get("wall_s") or {}).items() if _number(v)}
    return out


def flat_params(tree: dict, prefix: str = "") -> dict[str, str]:
    """A nested config as ``{"train.lr": "1e-05", ...}``: lists and other leaves as JSON text."""
    out: dict[str, str] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out |= flat_params(v, key + ".")
        else:
            out[key] = v if isinstance(v, str) else json.dumps(v)
    return out


class TrackerUnavailable(RuntimeError):
    """A tracker that cannot be started; the message says why (never a secret)."""


# --------------------------------------------------------------------------- the trackers


class TensorBoardTracker:
    """Event files under ``logdir`` (tensorboardX): scalars per step, the config and the summary as text."""

    name = "tensorboard"

    def __init__(self, logdir: str, config_yaml: str):
        from tensorboardX import SummaryWriter

        self.logdir = logdir
        self.writer = SummaryWriter(logdir=logdir)
        self.writer.add_text("config", "```yaml\n" + config_yaml + "```", 0)
        self.writer.flush()

    def step(self, step: int, scalars: dict[str, float], unix_time: float) -> None:
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, step, walltime=unix_time)
        self.writer.flush()  # a stopped run keeps its curve

    def summary(self, summary: dict, scalars: dict[str, float], step: int) -> None:
        if _number(summary.get("eval_loss_initial")):
            self.writer.add_scalar("eval/loss", summary["eval_loss_initial"], 0)
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, step)
        self.writer.add_text("summary", "```json\n" + json.dumps(summary, indent=2) + "\n```", step)
        self.writer.flush()

    def artifact(self, path: str, name: str) -> None:
        pass  # TensorBoard holds no files

    def close(self, status: str) -> None:
        self.writer.close()


def check_http_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """Raise :class:`TrackerUnavailable` when nothing answers HTTP at ``uri`` (any HTTP answer,
    an error status included, counts as reached; other URIs are not checked)."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s).close()
    except urllib.error.HTTPError:
        return  # a server answered (an auth proxy may refuse /health)
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise TrackerUnavailable(f"{uri} not reached ({reason})") from None


class MlflowTracker:
    """One MLflow run (``MlflowClient``): the flattened config as parameters, metrics per step,
    the summary (metrics and ``rayft_summary.json``), the HF export as artifacts under ``hf/``."""

    name = "mlflow"

    def __init__(self, cfg: MlflowConfig, run_name: str, params: dict[str, str], run_dir: str):
        check_http_reachable(cfg.tracking_uri)
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=cfg.tracking_uri)
        exp = self.client.get_experiment_by_name(cfg.experiment)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(cfg.experiment)
        run = self.client.create_run(exp_id, run_name=cfg.run_name or run_name, tags={"rayft.run_dir": run_dir})
        self.run_id = run.info.run_id
        self.where = f"{cfg.tracking_uri} experiment {cfg.experiment!r} run {self.run_id}"
        items = [Param(k[:250], v if len(v) <= MLFLOW_PARAM_MAX else v[: MLFLOW_PARAM_MAX - 1] + "…") for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 parameters per call
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def _metrics(self, scalars: dict[str, float], step: int, unix_time: float) -> None:
        from mlflow.entities import Metric

        ms = int(unix_time * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, ms, step) for k, v in scalars.items()])

    def step(self, step: int, scalars: dict[str, float], unix_time: float) -> None:
        self._metrics(scalars, step, unix_time)

    def summary(self, summary: dict, scalars: dict[str, float], step: int) -> None:
        if _number(summary.get("eval_loss_initial")):
            self._metrics({"eval/loss": float(summary["eval_loss_initial"])}, 0, time.time())
        self._metrics(scalars, step, time.time())
        self.client.log_dict(self.run_id, summary, "rayft_summary.json")

    def artifact(self, path: str, name: str) -> None:
        self.client.log_artifacts(self.run_id, path, artifact_path=name)

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status)


class WandbTracker:
    """One W&B run (``wandb.init``, files under ``run_dir/wandb``): the config, metrics per step,
    the summary's numbers in the run summary."""

    name = "wandb"

    def __init__(self, cfg: WandbConfig, run_name: str, config: dict, run_dir: str):
        import wandb

        self.wandb = wandb
        self.run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            name=cfg.run_name or run_name,
            mode=cfg.mode,
            dir=run_dir,
            config=config,
            settings=wandb.Settings(console="off", silent=True, init_timeout=60),
            reinit="create_new",
        )
        self.where = f"{cfg.mode} run {self.run.id} in {Path(self.run.dir).parent}"

    def step(self, step: int, scalars: dict[str, float], unix_time: float) -> None:
        self.run.log(scalars, step=step)

    def summary(self, summary: dict, scalars: dict[str, float], step: int) -> None:
        self.run.summary.update(scalars)

    def artifact(self, path: str, name: str) -> None:
        pass  # the export stays in the run directory (a model upload is left to the user)

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)


# --------------------------------------------------------------------------- feeding them


class _Feed:
    """One tracker behind a queue and a thread: calls run in order; the first failure is one
    warning, and the tracker is then off."""

    def __init__(self, tracker, say: Callable[[str], None]):
        self.tracker, self.say = tracker, say
        self.q: queue.Queue = queue.Queue()
        self.failed = False
        self.thread = threading.Thread(target=self._run, name=f"rayft-{tracker.name}", daemon=True)
        self.thread.start()

    def put(self, method: str, *args) -> None:
        if not self.failed:
            self.q.put((method, args))

    def _run(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            method, args = item
            if self.failed:
                continue
            try:
                getattr(self.tracker, method)(*args)
            except Exception as e:  # any error of a tracker's library: the run goes on without it
                self.failed = True
                self.say(
                    f"warning: tracking.{self.tracker.name}: {method} failed ({type(e).__name__}: {e}); it is off for the rest of the run"
                )

    def finish(self, status: str, wait_s: float | None) -> None:
        self.put("close", status)
        self.q.put(None)
        self.thread.join(wait_s)
        if self.thread.is_alive():
            self.say(f"warning: tracking.{self.tracker.name}: not done after {wait_s:g} s; what is still queued is not sent")


class Trackers:
    """The run's trackers (:meth:`open`), fed by the driver; a context manager that closes them
    (MLflow run status FINISHED, FAILED on an error, KILLED on a stop)."""

    def __init__(self, feeds: list[_Feed]):
        self.feeds = feeds
        self.last_step = 0

    @classmethod
    def open(cls, cfg: RayftConfig, run_dir: str, run_name: str, say: Callable[[str], None]) -> Trackers:
        """Start the trackers ``cfg.tracking`` turns on for the run ``run_name`` in ``run_dir``,
        each given the resolved config. A tracker that cannot start is one warning through
        ``say`` and is left out. TensorBoard and W&B write into a local run directory (with one
        on object storage: into a local temporary directory, said once)."""
        tracking, config = cfg.tracking, cfg.model_dump(mode="json")
        feeds = []
        names = tracking.enabled()
        local_dir = run_dir
        if names and "://" in run_dir and (tracking.tensorboard or tracking.wandb):
            import tempfile

            local_dir = tempfile.mkdtemp(prefix=f"rayft-{run_name}-")
            say(f"tracking: the run directory is on object storage; TensorBoard and W&B files go to {local_dir}")
        for name in names:
            try:
                if name == "tensorboard":
                    tracker = TensorBoardTracker(os.path.join(local_dir, "tensorboard"), dump_config(cfg))
                    where = tracker.logdir
                elif name == "mlflow":
                    tracker = MlflowTracker(tracking.mlflow, run_name, flat_params(config), run_dir)
                    where = tracker.where
                else:
                    tracker = WandbTracker(tracking.wandb, run_name, config, local_dir)
                    where = tracker.where
            except Exception as e:  # unreachable, not installed, refused: the run goes on without it
                say(
                    f"warning: tracking.{name}: cannot start ({type(e).__name__}: {e}); the run goes on without it (rayft_metrics.jsonl is the record)"
                )
                continue
            say(f"tracking: {name} → {where}")
            feeds.append(_Feed(tracker, say))
        return cls(feeds)

    @property
    def names(self) -> list[str]:
        """The trackers started (and not failed since)."""
        return [f.tracker.name for f in self.feeds if not f.failed]

    def log_step(self, record: dict) -> None:
        """One step's metrics record (``step`` its x value; its ``unix_time`` the time stamp)."""
        self.last_step = int(record["step"])
        scalars = step_scalars(record)
        t = record.get("unix_time")
        for f in self.feeds:
            f.put("step", self.last_step, scalars, t if _number(t) and math.isfinite(t) else time.time())

    def log_summary(self, summary: dict) -> None:
        """The run's summary (``rayft_summary.json``): its numbers at the last step, the rest as text or a file."""
        scalars = summary_scalars(summary)
        step = int(summary.get("steps") or self.last_step)
        for f in self.feeds:
            f.put("summary", summary, scalars, step)

    def log_artifact(self, path: str | os.PathLike, name: str = "hf") -> None:
        """A local directory (the HF export) as the run's artifacts under ``name`` (MLflow)."""
        if Path(path).is_dir():
            for f in self.feeds:
                f.put("artifact", str(path), name)

    def close(self, status: str = "FINISHED") -> None:
        """Close every tracker: a finished run waits until all is sent; another waits at most
        :data:`CLOSE_WAIT_S` seconds for each."""
        wait = None if status == "FINISHED" else CLOSE_WAIT_S
        for f in self.feeds:
            f.finish(status, wait)
        self.feeds = []

    def __enter__(self) -> Trackers:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        from rayft.train.errors import TrainStopped

        self.close("FINISHED" if exc_type is None else "KILLED" if issubclass(exc_type, (TrainStopped, KeyboardInterrupt)) else "FAILED")
