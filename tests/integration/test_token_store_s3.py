"""A token store on s3:// (the moto server: a real HTTP S3 emulator on a loopback port): written
through pyarrow's S3 filesystem, opened again without reading the inputs, read by a worker-side
view that downloads each shard once into a node-local cache with its sha256 checked, and a changed
object refused. S3 inputs (JSON Lines by byte ranges, Parquet by row groups) read through pyarrow."""

from __future__ import annotations

import json
import logging
import pickle
import time
import urllib.request

import numpy as np
import pytest
from rich.console import Console

pytest.importorskip("moto", reason="the s3:// store test needs moto[server] (pip install 'moto[server]')")
boto3 = pytest.importorskip("boto3", reason="the s3:// store test needs boto3")

from rayft.config import RayftConfig
from rayft.data import token_store as ts
from rayft.data.prepare import prepare_data

pytestmark = pytest.mark.integration

RECORDS = [{"instruction": f"What is {a} + {b}?", "output": f"{a + b}"} for a in range(6) for b in range(5)]


@pytest.fixture(scope="module")
def moto_url():
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(moto_url, monkeypatch, tmp_path):
    for k in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)  # pyarrow's S3 filesystem honours it (from_uri), as boto3 does
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("RAYFT_SHARD_CACHE", str(tmp_path / "node-cache"))
    urllib.request.urlopen(urllib.request.Request(f"{moto_url}/moto-api/reset", method="POST")).read()
    client = boto3.client("s3")
    client.create_bucket(Bucket="data")
    return client


def cfg_for(tmp_path, cache_dir, **data):
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    d = {"train_files": [str(tmp_path / "a.jsonl")], "seq_len": 64, "preprocess": "local", "cache_dir": cache_dir, **data}
    return RayftConfig.model_validate({"data": d})


def run(cfg, tokenizer):
    console = Console(record=True, width=400)
    return prepare_data(cfg, console, tokenizer, "qwen2.5"), console.export_text().splitlines()


def examples(view):
    return [tuple(a.tobytes() for a in view.example(i)) for i in range(len(view))]


def test_store_on_s3_written_opened_and_read_by_a_verifying_view(s3, tmp_path, qwen_tokenizer):
    local, _ = run(cfg_for(tmp_path, str(tmp_path / "cache")), qwen_tokenizer)
    d, out = run(cfg_for(tmp_path, "s3://data/stores"), qwen_tokenizer)
    key = local.store.rsplit("/", 1)[1]
    assert d.store == f"s3://data/stores/{key}" and out[-1] == f"data: wrote the tokenized store {d.store}"
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="data", Prefix="stores/")["Contents"])
    assert f"stores/{key}/manifest.json" in keys and f"stores/{key}/train/000000-000.tokens.npy" in keys
    assert not any(".tmp-" in k for k in keys)
    manifest = json.loads(s3.get_object(Bucket="data", Key=f"stores/{key}/manifest.json")["Body"].read())
    tokens = manifest["parts"]["train"]["shards"][0]["files"]["tokens"]
    body = s3.get_object(Bucket="data", Key=f"stores/{key}/{tokens['file']}")["Body"].read()
    assert len(body) == tokens["size"] and __import__("hashlib").sha256(body).hexdigest() == tokens["sha256"]

    again, out = run(cfg_for(tmp_path, "s3://data/stores"), qwen_tokenizer)
    assert again.cache == "hit" and out[-1] == f"data: used the tokenized store {d.store} (no file read or tokenized)"
    assert again.fingerprint == local.fingerprint  # the same inputs and settings: the same selection, wherever the store is

    view = pickle.loads(pickle.dumps(again.train))  # as a worker receives it
    assert examples(view) == examples(local.train) and view.shards_touched() == [0]
    cached = list((tmp_path / "node-cache").rglob("*.npy"))
    assert sorted(p.name for p in cached) == ["000000-000.offsets.npy", "000000-000.tokens.npy", "000000-000.trainable.npy"]
    # a second view on the node reuses the verified copies
    assert examples(pickle.loads(pickle.dumps(again.train))) == examples(local.train)

    # an object changed after the store was written (same size): refused by a worker that downloads it
    tampered = bytearray(body)
    tampered[-1] ^= 0x01
    s3.put_object(Bucket="data", Key=f"stores/{key}/{tokens['file']}", Body=bytes(tampered))
    for p in cached:
        p.unlink()
    fresh = pickle.loads(pickle.dumps(again.train))
    with pytest.raises(ts.StoreError, match=r"sha256 .* does not match the manifest's .*refusing it"):
        fresh.example(0)
    assert not list((tmp_path / "node-cache").rglob("*.tokens.npy*"))  # nothing left half-verified
    # a truncated object is seen by the listing when the store is opened: rebuilt
    s3.put_object(Bucket="data", Key=f"stores/{key}/{tokens['file']}", Body=body[:-8])
    rebuilt, out = run(cfg_for(tmp_path, "s3://data/stores"), qwen_tokenizer)
    assert rebuilt.cache == "miss" and out[0].startswith(f"warning: ignoring a broken tokenized store, rebuilding it: {d.store}/train/")
    assert examples(pickle.loads(pickle.dumps(rebuilt.train))) == examples(local.train)


def test_s3_inputs_by_ranges_and_row_groups(s3, tmp_path, qwen_tokenizer):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from rayft.data.formats import load_conversations
    from rayft.data.ingest import Settings, ingest_part
    from rayft.data.ingest_tasks import plan_tasks
    from rayft.data.sources import expand_files

    body = "".join(json.dumps(r) + "\n" for r in RECORDS) + '{"instruction": 1}\n'
    s3.put_object(Bucket="data", Key="in/a.jsonl", Body=body.encode())
    pq.write_table(pa.Table.from_pylist(RECORDS), tmp_path / "t.parquet", row_group_size=4)
    s3.put_object(Bucket="data", Key="in/t.parquet", Body=(tmp_path / "t.parquet").read_bytes())
    files = expand_files(["s3://data/in"])
    tasks = plan_tasks(files, "train", 300)
    assert {t.kind for t in tasks} == {"range", "parquet"} and len(tasks) > 6
    st = Settings(str(tmp_path / "store"), 64, on_bad_record="skip")
    res = ingest_part(files, "train", st, qwen_tokenizer, chunk_bytes=300)
    ref = load_conversations(["s3://data/in"], on_bad_record="skip")
    assert res.accepted == len(ref) == 60 and res.skipped()["wrong_type"].where == "s3://data/in/a.jsonl:31"
    index = ts.PartIndex.read(st.location, res.shards)
    assert np.array_equal(index.record, np.arange(60))


def test_a_resume_on_s3_is_checked_before_any_worker(s3, ray_local, tmp_path):
    """--resume of a run on object storage: the driver reads the newest complete checkpoint's state
    file there (what Ray Train hands the workers; a newer one without its state file is an
    interrupted save) and refuses, before any worker starts, other training data and a model-only
    checkpoint with steps left, as it does for a local run directory."""
    from rayft.config_load import load_config
    from rayft.train.driver import TrainError, run_training
    from rayft.train.run_dir import newest_remote_state

    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    job = tmp_path / "job.yaml"
    job.write_text(
        "model: {name_or_path: qwen2-tiny}\n"
        "data: {train_files: [a.jsonl], seq_len: 64, packing: false, cache_dir: null}\n"
        "train: {num_workers: 1, use_gpu: false, micro_batch_size: 2, epochs: 1}\n"
        "checkpoint: {storage_path: 's3://data/runs'}\n"
    )
    run = "s3://data/runs/t"
    assert newest_remote_state(run) is None  # nothing there yet
    s3.put_object(Bucket="data", Key="runs/t/checkpoint_0000004/rayft_state.json", Body=json.dumps({"step": 4}).encode())
    s3.put_object(
        Bucket="data", Key="runs/t/checkpoint_0000006/rayft_state.json", Body=json.dumps({"step": 6, "contents": "model"}).encode()
    )
    s3.put_object(Bucket="data", Key="runs/t/checkpoint_0000008/__0_0.distcp", Body=b"an interrupted save")
    assert newest_remote_state(run) == ("s3://data/runs/t/checkpoint_0000006", {"step": 6, "contents": "model"})
    t0 = time.perf_counter()
    with pytest.raises(TrainError, match=r"s3://data/runs/t/checkpoint_0000006 holds the model's weights only .* from its step 6 to 15"):
        run_training(load_config(job, []), resume=run)
    s3.put_object(
        Bucket="data", Key="runs/t/checkpoint_0000006/rayft_state.json", Body=json.dumps({"step": 6, "data_fingerprint": "0123"}).encode()
    )
    with pytest.raises(TrainError, match=r"checkpoint_0000006: the training data changed since this checkpoint \(fingerprint 0123 → "):
        run_training(load_config(job, []), resume=run)
    s3.put_object(Bucket="data", Key="runs/t/checkpoint_0000006/rayft_state.json", Body=b'{"step": 6,')  # cut short
    with pytest.raises(TrainError, match=r"s3://data/runs/t/checkpoint_0000006/rayft_state.json is not a JSON state file"):
        run_training(load_config(job, []), resume=run)
    assert time.perf_counter() - t0 < 60
