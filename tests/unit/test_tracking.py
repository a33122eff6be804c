"""The driver's trackers (rayft.tracking) fed a short synthetic history, read back with each
tracker's own reader: TensorBoard's EventAccumulator, a real `mlflow server` on loopback through
MlflowClient, and the W&B offline run's transaction log. And the `tracking:` config section."""

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rayft.config import ConfigError, RayftConfig
from rayft.config_load import load_config
from rayft.tracking import Trackers, flat_params

HISTORY = [
    {"step": s, "loss": 6.0 / s, "lr": 1e-3 * s, "grad_norm": 0.5 + s, "epoch": 0, "tokens_per_s_per_gpu": 1000.0 + s, "mfu": None}
    | ({"eval_loss": 5.0 - s / 10} if s % 2 == 0 else {})
    | {"unix_time": 1_700_000_000.0 + s}
    for s in range(1, 6)
]
SUMMARY = {"steps": 5, "final_loss": 1.2, "median_tokens_per_s_per_gpu": 1003.0, "eval_loss_initial": 5.5, "wall_s": {"total": 9.5}}


def config(tracking: dict) -> RayftConfig:
    return RayftConfig.model_validate({"data": {"train_files": ["x.jsonl"]}, "train": {"lr": 3e-4}, "tracking": tracking})


def feed(cfg: RayftConfig, run_dir: Path, artifact: Path | None = None) -> tuple[Trackers, list[str]]:
    said: list[str] = []
    trackers = Trackers.open(cfg, str(run_dir), "unit-run", say=said.append)
    with trackers:
        for rec in HISTORY:
            trackers.log_step(rec)
        trackers.log_summary(SUMMARY)
        if artifact is not None:
            trackers.log_artifact(artifact, "hf")
    return trackers, said


# --------------------------------------------------------------------------- config


def test_tracking_config_refuses_secrets_and_typos_naming_the_line(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text("data: {train_files: [x.jsonl]}\ntracking:\n  wandb:\n    project: p\n    api_key: sekrit-123\n")
    with pytest.raises(ConfigError) as e:
        load_config(f)
    msg = str(e.value)
    assert "tracking.wandb.api_key (line 5): secrets are not read from the config file" in msg and "WANDB_API_KEY" in msg
    assert "sekrit-123" not in msg

    f.write_text("data: {train_files: [x.jsonl]}\ntracking:\n  mlflow:\n    tracking_uri: https://me:pa55word@mlflow.example\n")
    with pytest.raises(ConfigError) as e:
        load_config(f)
    assert "tracking.mlflow (line 3)" in str(e.value) and "MLFLOW_TRACKING_PASSWORD" in str(e.value) and "pa55word" not in str(e.value)

    f.write_text("data: {train_files: [x.jsonl]}\ntracking: {tensorbord: true}\n")
    with pytest.raises(ConfigError, match=r"tracking.tensorbord \(line 2\): unknown key \(did you mean 'tensorboard'\?\)"):
        load_config(f)
    f.write_text("data: {train_files: [x.jsonl]}\ntracking: {mlflow: {tracking_uri: 'http://127.0.0.1:5000'}, tensorboard: true}\n")
    cfg = load_config(f)
    assert cfg.tracking.enabled() == ["tensorboard", "mlflow"] and cfg.tracking.mlflow.experiment == "rayft"


# --------------------------------------------------------------------------- TensorBoard


def test_tensorboard_event_files_hold_the_logged_values(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trackers, said = feed(config({"tensorboard": True}), tmp_path)
    assert said == [f"tracking: tensorboard → {tmp_path / 'tensorboard'}"]
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()

    def curve(tag):
        return [(e.step, e.value) for e in acc.Scalars(tag)]

    f32 = lambda x: float(np.float32(x))  # noqa: E731 (TensorBoard scalars are float32)
    assert curve("train/loss") == [(h["step"], f32(h["loss"])) for h in HISTORY]
    assert curve("train/lr") == [(h["step"], f32(h["lr"])) for h in HISTORY]
    assert curve("perf/tokens_per_s_per_gpu") == [(h["step"], f32(h["tokens_per_s_per_gpu"])) for h in HISTORY]
    assert curve("eval/loss") == [(2, f32(4.8)), (4, f32(4.6)), (0, f32(5.5))]  # the initial eval at step 0 comes with the summary
    assert [e.wall_time for e in acc.Scalars("train/grad_norm")] == [h["unix_time"] for h in HISTORY]
    assert "perf/mfu" not in acc.Tags()["scalars"]  # None on CPU: not logged
    assert curve("summary/final_loss") == [(5, f32(1.2))]
    text = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "lr: 0.0003" in text and "tensorboard: true" in text


# --------------------------------------------------------------------------- MLflow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` on a loopback port: SQLite backend store, local artifact store."""
    pytest.importorskip("mlflow", reason="needs mlflow (pip install 'rayft[tracking]')")
    d = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")  # no job-runner processes
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    cmd += ["--backend-store-uri", f"sqlite:///{d / 'mlflow.db'}", "--artifacts-destination", str(d / "artifacts")]
    log = open(d / "server.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    try:
        import urllib.request

        while True:
            try:
                urllib.request.urlopen(uri + "/health", timeout=2).close()
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    pytest.fail(f"mlflow server did not start: {(d / 'server.log').read_text()[-2000:]}")
                time.sleep(0.25)
        yield uri
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server's process group: the one this fixture started
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def test_mlflow_server_gets_params_metrics_summary_and_the_export(mlflow_server, tmp_path, monkeypatch, capsys):
    from mlflow.tracking import MlflowClient

    # credentials come from the environment only; they must not reach the params or any output
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "pw-do-not-print-42")
    export = tmp_path / "hf"
    export.mkdir()
    (export / "config.json").write_text('{"model_type": "qwen2"}')
    (export / "model.safetensors").write_bytes(b"\0" * 1000)
    cfg = config({"mlflow": {"tracking_uri": mlflow_server, "experiment": "unit"}})
    _, said = feed(cfg, tmp_path, artifact=export)
    assert len(said) == 1 and said[0].startswith(f"tracking: mlflow → {mlflow_server} experiment 'unit' run ")

    client = MlflowClient(tracking_uri=mlflow_server)
    (run,) = client.search_runs([client.get_experiment_by_name("unit").experiment_id])
    assert run.info.run_name == "unit-run" and run.info.status == "FINISHED"
    params = run.data.params
    assert params["train.lr"] == "0.0003" and params["data.train_files"] == '["x.jsonl"]' and params["tracking.mlflow.experiment"] == "unit"
    assert len(params) == len(flat_params(cfg.model_dump(mode="json")))  # every leaf of the config
    loss = client.get_metric_history(run.info.run_id, "train/loss")
    assert [(m.step, m.value, m.timestamp) for m in loss] == [(h["step"], h["loss"], int(h["unix_time"] * 1000)) for h in HISTORY]
    evals = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "eval/loss"))
    assert evals == [(0, 5.5), (2, 4.8), (4, 4.6)]
    assert run.data.metrics["summary/final_loss"] == 1.2 and run.data.metrics["summary/wall_s/total"] == 9.5
    files = {a.path for a in client.list_artifacts(run.info.run_id)} | {a.path for a in client.list_artifacts(run.info.run_id, "hf")}
    assert {"rayft_summary.json", "hf", "hf/config.json", "hf/model.safetensors"} <= files
    got = Path(client.download_artifacts(run.info.run_id, "hf/config.json", str(tmp_path / "dl")))
    assert got.read_text() == '{"model_type": "qwen2"}'
    assert json.loads(Path(client.download_artifacts(run.info.run_id, "rayft_summary.json", str(tmp_path / "dl"))).read_text()) == SUMMARY
    out = capsys.readouterr()
    assert not any("pw-do-not-print-42" in v for v in [*params.values(), *said, out.out, out.err])


def test_mlflow_error_mid_run_is_one_warning_then_that_tracker_is_off(mlflow_server, tmp_path):
    from mlflow.tracking import MlflowClient

    said: list[str] = []
    cfg = config({"mlflow": {"tracking_uri": mlflow_server, "experiment": "unit-fail"}})
    with Trackers.open(cfg, str(tmp_path), "doomed", say=said.append) as trackers:
        trackers.log_step(HISTORY[0])
        client = MlflowClient(tracking_uri=mlflow_server)
        (run,) = client.search_runs([client.get_experiment_by_name("unit-fail").experiment_id])
        deadline = time.time() + 30
        while not client.get_metric_history(run.info.run_id, "train/loss") and time.time() < deadline:
            time.sleep(0.1)
        client.delete_run(run.info.run_id)  # the server now refuses every write to this run
        for rec in HISTORY[1:]:
            trackers.log_step(rec)
        trackers.log_summary(SUMMARY)
    warnings = [s for s in said if s.startswith("warning")]
    assert len(warnings) == 1 and warnings[0].startswith("warning: tracking.mlflow: step failed (") and "off for the rest" in warnings[0]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == [1]


def test_unreachable_mlflow_is_one_warning_at_start_and_no_error(tmp_path):
    port = free_port()  # nothing listens there
    said: list[str] = []
    cfg = config({"mlflow": {"tracking_uri": f"http://127.0.0.1:{port}"}, "tensorboard": True})
    with Trackers.open(cfg, str(tmp_path), "r", say=said.append) as trackers:
        for rec in HISTORY:
            trackers.log_step(rec)
        trackers.log_summary(SUMMARY)
    assert trackers.names == [] and said[0].startswith("tracking: tensorboard")
    assert said[1:] == [
        f"warning: tracking.mlflow: cannot start (TrackerUnavailable: http://127.0.0.1:{port} not reached ([Errno 111] Connection refused)); "
        "the run goes on without it (rayft_metrics.jsonl is the record)"
    ]


# --------------------------------------------------------------------------- W&B


def wandb_records(path: Path):
    """The protobuf records of a W&B transaction log (``run-<id>.wandb``): a 7-byte header, then
    LevelDB-log-format chunks (crc32 u32, length u16, type u8: 1 full, 2 first, 3 middle, 4 last)
    in 32 KiB blocks."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, buf = path.read_bytes(), 32768, 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if n == 0 and kind == 0:
            pos += left
            continue
        buf += data[pos + 7 : pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            yield rec
            buf = b""


def test_wandb_offline_run_holds_config_history_and_summary(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="needs wandb (pip install 'rayft[tracking]')")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)  # offline: never used, and never written
    _, said = feed(config({"wandb": {"project": "unit", "mode": "offline"}}), tmp_path)
    assert len(said) == 1 and said[0].startswith("tracking: wandb → offline run ")
    (log,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    deadline = time.time() + 30  # wandb-core, a process of its own, may still be writing the log when finish() returns
    while not any(r.WhichOneof("record_type") == "exit" for r in wandb_records(log)) and time.time() < deadline:
        time.sleep(0.2)
    history, summary, config_items = [], {}, {}
    for rec in wandb_records(log):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "summary":
            summary |= {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.summary.update}
        elif kind == "run":
            config_items = {i.key: json.loads(i.value_json) for i in rec.run.config.update}
            assert rec.run.project == "unit" and rec.run.display_name == "unit-run"
    assert [(h["_step"], h["train/loss"], h["train/lr"]) for h in history] == [(r["step"], r["loss"], r["lr"]) for r in HISTORY]
    assert [h.get("eval/loss") for h in history] == [r.get("eval_loss") for r in HISTORY]
    assert summary["summary/final_loss"] == 1.2 and summary["summary/median_tokens_per_s_per_gpu"] == 1003.0
    assert config_items["train"]["lr"] == 3e-4 and config_items["tracking"]["wandb"]["mode"] == "offline"
    assert b"k" * 40 not in b"".join(p.read_bytes() for p in (tmp_path / "wandb").rglob("*") if p.is_file())
