"""Training data read from s3:// URIs, against the moto server (a real HTTP S3 emulator on a
loopback port the OS assigns): objects are listed and read through boto3, and every record and
error names its s3:// URI and line."""

from __future__ import annotations

import gzip
import logging
import urllib.request

import pytest

pytest.importorskip("moto", reason="the s3:// reader test needs moto[server] (pip install 'moto[server]')")
boto3 = pytest.importorskip("boto3", reason="the s3:// reader needs boto3")
zstandard = pytest.importorskip("zstandard", reason="the .zst part of the test needs zstandard")

from rayft.data.formats import DataError, expand_files, load_conversations
from rayft.data.sources import S3Object

pytestmark = pytest.mark.integration

GOOD = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}'


@pytest.fixture(scope="module")
def moto_url():
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)  # port 0: the OS picks
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(moto_url, monkeypatch):
    """A boto3 S3 client on the moto server (fake credentials, state reset), with a bucket ``data``."""
    for k in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    urllib.request.urlopen(urllib.request.Request(f"{moto_url}/moto-api/reset", method="POST")).read()
    client = boto3.client("s3")
    client.create_bucket(Bucket="data")
    return client


def test_prefix_lists_and_reads_data_objects(s3):
    s3.put_object(Bucket="data", Key="train/a.jsonl", Body=(GOOD + "\n\n" + GOOD + "\n").encode())
    s3.put_object(Bucket="data", Key="train/b.json.gz", Body=gzip.compress(b'[\n {"instruction": "i", "output": "o"}\n]\n'))
    s3.put_object(Bucket="data", Key="train/c.jsonl.zst", Body=zstandard.ZstdCompressor().compress(b'{"text": "doc"}\n'))
    s3.put_object(Bucket="data", Key="train/README.md", Body=b"not data")
    s3.put_object(Bucket="data", Key="train/old/x.jsonl", Body=b"not read: a sub-folder")
    s3.put_object(Bucket="data", Key="train2/y.jsonl", Body=b"not read: another prefix")
    files = expand_files(["s3://data/train"])
    assert files == [S3Object("data", "train/a.jsonl"), S3Object("data", "train/b.json.gz"), S3Object("data", "train/c.jsonl.zst")]
    assert expand_files(["s3://data/train/"]) == files
    report = load_conversations(["s3://data/train"])
    assert [x.source for x in report] == [
        "s3://data/train/a.jsonl:1",
        "s3://data/train/a.jsonl:3",
        "s3://data/train/b.json.gz:2",
        "s3://data/train/c.jsonl.zst:1",
    ]
    assert report[2].messages == ({"role": "user", "content": "i"}, {"role": "assistant", "content": "o"})
    assert report[3].text == "doc"
    assert report.notes == ["s3://data/train/a.jsonl: tolerated: 1 blank line"]
    # one object by its key
    assert [x.source for x in load_conversations(["s3://data/train/b.json.gz"])] == ["s3://data/train/b.json.gz:2"]
    with pytest.raises(DataError) as e:
        expand_files(["s3://data/train", "s3://data/train/a.jsonl"])
    assert str(e.value) == "s3://data/train/a.jsonl: listed more than once in data.train_files (its records would be trained twice)"


def test_bad_records_name_the_s3_uri_and_line(s3):
    body = f'{GOOD}\n{GOOD}\n{{"messages": [{{"role": "user", "content": "q"}}]}}\n{GOOD}\n'
    s3.put_object(Bucket="data", Key="bad/x.jsonl.zst", Body=zstandard.ZstdCompressor().compress(body.encode()))
    with pytest.raises(DataError) as e:
        load_conversations(["s3://data/bad"])
    assert str(e.value) == "s3://data/bad/x.jsonl.zst:3: no assistant turn (nothing to train on)"
    report = load_conversations(["s3://data/bad/x.jsonl.zst"], on_bad_record="skip")
    assert len(report) == 3 and report.skipped["no_assistant_turn"].where == "s3://data/bad/x.jsonl.zst:3"


@pytest.mark.parametrize(
    "uri,message",
    [
        ("s3://data/none", "s3://data/none: no such object, and no object under s3://data/none/ (data.train_files)"),
        (
            "s3://nobucket/x",
            "s3://nobucket/x: cannot list: An error occurred (NoSuchBucket) when calling the ListObjectsV2 operation: The specified bucket does not exist",
        ),
        (
            "s3://data/mixed",
            "s3://data/mixed: holds ['b.csv']: these files are not supported yet (supported: .json, .jsonl, .json.gz, .jsonl.gz, .json.zst, .jsonl.zst, .parquet; decompress or convert to JSONL)",
        ),
        (
            "s3://data/mixed/b.csv",
            "s3://data/mixed/b.csv: this kind of file is not supported yet (supported: .json, .jsonl, .json.gz, .jsonl.gz, .json.zst, .jsonl.zst, .parquet; decompress or convert to JSONL)",
        ),
        (
            "s3://data/notes",
            "s3://data/notes: directory has no data file (.json, .jsonl, .json.gz, .jsonl.gz, .json.zst, .jsonl.zst, .parquet) (data.train_files)",
        ),
        ("s3:///x.jsonl", "s3:///x.jsonl: no bucket named (expected s3://bucket/prefix)"),
    ],
)
def test_s3_errors_name_the_uri(s3, uri, message):
    s3.put_object(Bucket="data", Key="mixed/a.jsonl", Body=GOOD.encode())
    s3.put_object(Bucket="data", Key="mixed/b.csv", Body=b"a,b")
    s3.put_object(Bucket="data", Key="notes/readme.txt", Body=b"x")
    with pytest.raises(DataError) as e:
        expand_files([uri])
    assert str(e.value) == message


def test_parquet_object_rows(s3, tmp_path):
    pa = pytest.importorskip("pyarrow", reason="Parquet input needs pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"instruction": "i", "output": "o"}, {"instruction": "j"}]), tmp_path / "t.parquet")
    s3.put_object(Bucket="data", Key="pq/t.parquet", Body=(tmp_path / "t.parquet").read_bytes())
    with pytest.raises(DataError) as e:
        load_conversations(["s3://data/pq"])
    assert str(e.value) == "s3://data/pq/t.parquet:row 1: missing field 'output'"


def test_corrupt_object_names_its_uri(s3):
    s3.put_object(Bucket="data", Key="z/x.jsonl.gz", Body=GOOD.encode())
    with pytest.raises(DataError) as e:
        load_conversations(["s3://data/z"])
    assert str(e.value) == "s3://data/z/x.jsonl.gz: not a valid gzip file: Not a gzipped file (b'{\"')"


def test_data_check_reads_an_s3_prefix_like_training(s3):
    import json

    from typer.testing import CliRunner

    from rayft.cli import app

    s3.put_object(Bucket="data", Key="check/a.jsonl", Body=(GOOD + '\n{"messages": []}\n' + GOOD + "\n").encode())
    s3.put_object(Bucket="data", Key="check/b.jsonl", Body=(GOOD + "\n").encode())
    r = CliRunner().invoke(app, ["data", "check", "s3://data/check"])
    assert r.exit_code == 1, r.output
    assert r.stdout.splitlines() == [
        "s3://data/check/a.jsonl: 3 records: 2 accepted, 1 bad",
        "  empty_conversation: 1",
        "    s3://data/check/a.jsonl:2: empty conversation",
        "s3://data/check/b.jsonl: 1 records: 1 accepted, 0 bad",
        "checked 2 file(s): 4 records, 3 accepted, 1 bad",
    ]
    doc = json.loads(CliRunner().invoke(app, ["data", "check", "s3://data/check/b.jsonl", "--json"]).stdout)
    assert (doc["ok"], doc["records"], [f["file"] for f in doc["files"]]) == (True, 1, ["s3://data/check/b.jsonl"])
    r = CliRunner().invoke(app, ["data", "check", "s3://data/nothing-here"])
    assert r.exit_code == 2 and r.stderr.startswith("error: s3://data/nothing-here: no such object")
