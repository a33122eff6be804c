import textwrap

import pytest

from rayft.config import ConfigError
from rayft.config_load import dump_config, load_config


def write(tmp_path, text, name="job.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_minimal_config_fills_defaults_and_resolves_relative_data(tmp_path):
    (tmp_path / "d.jsonl").write_text("{}\n")
    cfg = load_config(write(tmp_path, "data:\n  train_files: d.jsonl\n"))
    assert cfg.data.train_files == [str((tmp_path / "d.jsonl").resolve())]
    assert cfg.train.num_workers == "auto"
    assert cfg.parallel.param_dtype == "bfloat16" and cfg.parallel.reduce_dtype == "float32"
    assert cfg.model.name_or_path == "qwen2-tiny"


def test_unknown_key_names_file_key_path_and_line(tmp_path):
    p = write(
        tmp_path,
        """\
        data:
          train_files: [x.json]
        train:
          micro_batch_size: 4
          lerning_rate: 0.1
        """,
    )
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert str(p) in msg
    assert "train.lerning_rate (line 5): unknown key" in msg


def test_wrong_type_names_key_line_and_value(tmp_path):
    p = write(tmp_path, "data:\n  train_files: [x.json]\ntrain:\n  micro_batch_size: eight\n")
    with pytest.raises(ConfigError, match=r"train\.micro_batch_size \(line 4\): .*integer.*'eight'"):
        load_config(p)


def test_missing_required_section(tmp_path):
    with pytest.raises(ConfigError, match=r"data \(line|data: required key is missing"):
        load_config(write(tmp_path, "train:\n  lr: 1e-4\n"))


def test_yaml_syntax_error_has_line_and_column(tmp_path):
    p = write(tmp_path, "data:\n  train_files: [a.json\ntrain: {}\n")
    with pytest.raises(ConfigError, match=r"job.yaml: line \d+, column \d+: YAML syntax error"):
        load_config(p)


def test_top_level_must_be_mapping(tmp_path):
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))


def test_missing_file():
    with pytest.raises(ConfigError, match="nope.yaml: config file not found"):
        load_config("nope.yaml")


def test_set_overrides_parse_yaml_values_and_create_sections(tmp_path):
    p = write(tmp_path, "data:\n  train_files: [x.json]\n")
    cfg = load_config(p, ["train.max_steps=7", "train.lr=3e-4", "ray.address=auto", "data.packing=false", "train.num_workers=2"])
    assert cfg.train.max_steps == 7 and cfg.train.lr == pytest.approx(3e-4)
    assert cfg.ray.address == "auto" and cfg.data.packing is False and cfg.train.num_workers == 2


def test_set_override_errors(tmp_path):
    p = write(tmp_path, "data:\n  train_files: [x.json]\n")
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load_config(p, ["train.max_steps"])
    with pytest.raises(ConfigError, match=r"train\.max_stepz \(from --set\): unknown key"):
        load_config(p, ["train.max_stepz=3"])
    with pytest.raises(ConfigError, match="'train' is not a section"):
        load_config(write(tmp_path, "data:\n  train_files: [x.json]\ntrain: 3\n", "b.yaml"), ["train.lr=1"])


def test_cross_field_check(tmp_path):
    p = write(tmp_path, "data:\n  train_files: [x.json]\ntrain:\n  max_steps: 5\n  warmup_steps: 10\n")
    with pytest.raises(ConfigError, match=r"warmup_steps \(10\) exceeds train.max_steps \(5\)"):
        load_config(p)


def test_dump_round_trips(tmp_path):
    p = write(tmp_path, "data:\n  train_files: [x.json]\ntrain:\n  lr: 0.001\n")
    cfg = load_config(p)
    again = load_config(write(tmp_path, dump_config(cfg), "again.yaml"))
    assert again == cfg


def test_examples_validate():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "examples"
    q = load_config(root / "quickstart.yaml")
    assert q.train.num_workers == 2 and q.train.use_gpu is False and Path(q.data.train_files[0]).is_file()
    big = load_config(root / "qwen2.5-1.5b.yaml")
    assert big.model.name_or_path == "Qwen/Qwen2.5-1.5B" and big.train.num_workers == 8


def test_cli_config_show(tmp_path):
    from typer.testing import CliRunner

    from rayft.cli import app

    p = write(tmp_path, "data:\n  train_files: [x.json]\n")
    r = CliRunner().invoke(app, ["config", "show", str(p), "--set", "train.lr=0.5"])
    assert r.exit_code == 0, r.output
    assert "lr: 0.5" in r.output and "micro_batch_size: 8" in r.output
    bad = CliRunner().invoke(app, ["config", "show", str(write(tmp_path, "data: {train_files: [x], foo: 1}\n", "bad.yaml"))])
    assert bad.exit_code == 2 and "data.foo" in bad.output


def test_duplicate_keys_are_errors_with_both_lines(tmp_path):
    p = write(tmp_path, "data:\n  train_files: [x.json]\n  seq_len: 100\n  seq_len: 200\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'seq_len' \(lines 3 and 4\)"):
        load_config(p)


@pytest.mark.parametrize("value", ["0", "-3"])
def test_num_workers_must_be_positive(tmp_path, value):
    p = write(tmp_path, f"data:\n  train_files: [x.json]\ntrain:\n  num_workers: {value}\n")
    with pytest.raises(ConfigError, match=r"train\.num_workers"):
        load_config(p)


def test_absurd_nesting_is_a_config_error(tmp_path):
    p = write(tmp_path, "data:\n  train_files: [x.json]\nmodel:\n  config_overrides:\n    x: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_config(p)


def test_flash_attention_with_packed_micro_batches_is_refused(tmp_path):
    p = write(tmp_path, "data:\n  train_files: [x.json]\nmodel:\n  attn_implementation: flash_attention_2\ntrain:\n  micro_batch_size: 4\n")
    with pytest.raises(ConfigError, match=r"flash_attention_2 with data.packing needs train.micro_batch_size: 1"):
        load_config(p)
    assert load_config(p, ["train.micro_batch_size=1"]).model.attn_implementation == "flash_attention_2"


def test_dashboard_url_as_ray_address_is_explained(tmp_path):
    from rayft.train.driver import TrainError
    from rayft.train.ray_cluster import connect_ray

    cfg = load_config(write(tmp_path, "data:\n  train_files: [x.json]\nray:\n  address: http://127.0.0.1:8265\n"))
    with pytest.raises(TrainError, match=r"dashboard \(job submission\) URL: use `rayft submit`"):
        connect_ray(cfg)


def test_a_value_failing_every_union_member_is_one_error(tmp_path):
    p = write(tmp_path, "data:\n  train_files: [x.json]\n")
    with pytest.raises(ConfigError) as e:
        load_config(p, ["train.num_workers=0"])
    assert str(e.value).splitlines()[1:] == [
        "  train.num_workers (from --set): Input should be greater than or equal to 1, or input should be 'auto' (got 0)"
    ]
    assert "(1 error)" in str(e.value)
    with pytest.raises(ConfigError, match=r"  trian \(from --set\): unknown key"):
        load_config(p, ["trian.lr=1"])  # a misspelt section named from its --set too


def test_resume_of_a_missing_run_fails_before_any_data_or_ray_work(tmp_path, monkeypatch):
    from rich.console import Console

    from rayft.train import driver
    from rayft.train.driver import TrainError, run_training

    def reached(*a, **k):  # Ray may be up in this test process already (an integration module before): watch the calls
        raise AssertionError("data or Ray work started before the resume check")

    monkeypatch.setattr(driver, "connect_ray", reached)
    monkeypatch.setattr(driver, "load_run_data", reached)

    p = write(tmp_path, f"data:\n  train_files: [{tmp_path / 'absent.jsonl'}]\ncheckpoint:\n  storage_path: {tmp_path / 'runs'}\n")
    cfg = load_config(p, [])
    for given, where in [("nope", tmp_path / "runs" / "nope"), (str(tmp_path / "elsewhere" / "r1"), tmp_path / "elsewhere" / "r1")]:
        with pytest.raises(TrainError) as e:
            run_training(cfg.model_copy(deep=True), resume=given, console=Console(quiet=True))
        # the data file does not exist either: the resume check came first
        assert str(e.value) == f"--resume {given}: no run directory at {where}"


@pytest.mark.parametrize(
    "key, line",
    [
        ("train.micro_batch_size", 4),
        ("train.num_workers", 4),
        ("train.lr", 4),
        ("train.max_steps", 4),
        ("checkpoint.every_minutes", 4),
        ("ray.max_failures", 4),
        ("cluster.num_nodes", 4),
        ("cluster.aws.volume_size_gib", 5),
        ("cluster.kube.job_backoff_limit", 5),
    ],
)
def test_a_boolean_is_not_taken_for_a_number(tmp_path, key, line):
    # pydantic alone reads `true` as 1 (or 1.0): micro_batch_size: true would train at micro-batch 1
    *sections, field = key.split(".")
    body = "".join("  " * i + f"{s}:\n" for i, s in enumerate(sections)) + "  " * len(sections) + f"{field}: true\n"
    p = write(tmp_path, "data:\n  train_files: [x.json]\n" + body)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(e.value).splitlines()[1:] == [f"  {key} (line {line}): Value error, expected a number, not a boolean (got True)"]
    with pytest.raises(ConfigError, match=rf"{key} \(from --set\): Value error, expected a number, not a boolean \(got False\)"):
        load_config(write(tmp_path, "data:\n  train_files: [x.json]\n", "plain.yaml"), [f"{key}=false"])


def test_booleans_and_numbers_still_load_where_they_belong(tmp_path):
    p = write(tmp_path, "data:\n  train_files: [x.json]\n  packing: false\ntrain:\n  use_gpu: true\n  lr: 1e-5\n  micro_batch_size: 3\n")
    cfg = load_config(p, ["train.compile=true", "cluster.efa=false", "checkpoint.every_minutes=2"])
    assert (cfg.data.packing, cfg.train.use_gpu, cfg.train.compile, cfg.cluster.efa) == (False, True, True, False)
    assert cfg.train.lr == 1e-5 and isinstance(cfg.train.lr, float)  # YAML 1.1 reads 1e-5 as a string: still a float
    assert cfg.train.micro_batch_size == 3 and cfg.checkpoint.every_minutes == 2.0


def test_takes_number_not_bool_reads_unions_literals_and_annotated():
    from typing import Annotated, Literal, Optional

    from pydantic import Field

    from rayft.config_base import takes_number_not_bool

    assert (
        takes_number_not_bool(int)
        and takes_number_not_bool(Optional[float])
        and takes_number_not_bool(Annotated[int, Field(ge=1)] | Literal["auto"])
    )
    assert not takes_number_not_bool(bool | Literal["auto"]) and not takes_number_not_bool(str) and not takes_number_not_bool(int | bool)
    assert not takes_number_not_bool(Literal["a", "b"]) and takes_number_not_bool(Literal[1, 2])


def test_a_boolean_element_is_not_taken_for_a_number(tmp_path):
    p = write(tmp_path, "data:\n  train_files: [x.json]\ntrain:\n  betas: [true, 0.95]\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(e.value).splitlines()[1:] == [
        "  train.betas (line 4): Value error, expected a number at [0], not a boolean (got [True, 0.95])"
    ]
    with pytest.raises(ConfigError, match=r"train.betas \(from --set\): Value error, expected a number at \[1\], not a boolean"):
        load_config(p, ["train.betas=[0.9, false]"])
    assert load_config(p, ["train.betas=[0.9, 0.99]"]).train.betas == (0.9, 0.99)
    from rayft.config_base import boolean_for_number

    assert boolean_for_number({"a": 1.0, "b": True}, dict[str, float]) == "['b']"
    assert boolean_for_number([[1, 2], [3, False]], list[list[int]]) == "[1][1]"
    assert boolean_for_number([1, True], tuple[int, ...]) == "[1]" and boolean_for_number([True, 2], tuple[bool, int]) is None
    assert boolean_for_number({"x": True}, dict[str, object]) is None and boolean_for_number(True, bool | None) is None


@pytest.mark.parametrize(
    "body, message",
    [
        ("data:\n  synthetic: {rows: 0x_}\n", r"line 2, column 21: YAML syntax error: cannot read '0x_' as int"),
        ("data:\n  train_files: [x.json]\ncheckpoint: {every_steps: !!int abc}\n", r"line 3, .*cannot read 'abc' as int"),
        ("data:\n  train_files: [x.json]\ntrain:\n  lr: !!float true\n", r"line 4, .*cannot read 'true' as float"),
        ("data:\n  train_files: [x.json]\n? [a, b]\n: 1\n", r"line 3, .*a key must be a plain value, not a list"),
        (
            "data:\n  train_files: [x.json]\ntrain:\n  on: 5\n",
            r"line 4, .*the key 'on' reads as bool True in YAML \(line 4\); keys are text: quote it",
        ),
        ("data:\n  train_files: [x.json]\nmodel:\n  config_overrides: {~: 3}\n", r"line 4, .*the key '~' reads as NoneType None"),
        (
            "data:\n  train_files: [x.json]\nmodel: {config_overrides: &a {x: *a}}\n",
            r"line 3, .*an alias refers to the anchor it is inside",
        ),
        (
            "data:\n  train_files: [x.json]\nmodel:\n  config_overrides:\n    x: " + "[" * 70 + "]" * 70 + "\n",
            r"nested more than 64 levels deep",
        ),
        (
            "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
            + "".join(f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefg", "bcdefgh")),
            r"expands to more than 1,000,000 values",
        ),
        ("data:\n  train_files: [x.json]\ntrain:\n  lr: .inf\n", r"train.lr \(line 4\): Input should be a finite number \(got inf\)"),
        ("data:\n  train_files: [x.json]\ntrain:\n  betas: [.nan, 0.9]\n", r"train.betas.0 \(line 4\): Input should be a finite number"),
        (
            "data:\n  train_files: [x.json]\ntrain:\n  seed: 1000000000000000000000000000000\n",
            r"train.seed \(line 4\): Value error, a number beyond 64 bits",
        ),
    ],
)
def test_hostile_yaml_is_a_config_error_with_its_line(tmp_path, body, message):
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, body))


def test_hostile_set_values(tmp_path):
    p = write(tmp_path, "data:\n  train_files: [x.json]\n")
    assert load_config(p, ["checkpoint.name=2024-02-30"]).checkpoint.name == "2024-02-30"  # date-like: the text itself
    assert (
        load_config(write(tmp_path, "data:\n  train_files: [x.json]\ncheckpoint: {name: 2024-02-03}\n", "d.yaml")).checkpoint.name
        == "2024-02-03"
    )
    with pytest.raises(ConfigError, match=r"data.seq_len \(from --set\): Input should be a valid integer.*got '!!int 0x'"):
        load_config(p, ["data.seq_len=!!int 0x"])
    with pytest.raises(ConfigError, match=r"--set model.config_overrides.x: the value is nested too deeply"):
        load_config(p, ["model.config_overrides.x=" + "[" * 3000 + "]" * 3000])
    with pytest.raises(ConfigError, match=r"--set model.config_overrides: an alias refers to the anchor it is inside"):
        load_config(p, ["model.config_overrides=&a {x: *a}"])


def test_error_positions_for_reader_errors_and_sections_touched_by_set(tmp_path):
    p = tmp_path / "nul.yaml"
    p.write_bytes(b"data:\n  train_files: [x.json]\ntrain:\n  lr: 0.1\x00\n")
    with pytest.raises(ConfigError, match=r"nul.yaml: line 4, column 10: YAML syntax error: special characters are not allowed"):
        load_config(p)
    # the fault is in the file's data section, not in the --set that also touched it
    with pytest.raises(ConfigError, match=r"  data \(line 1\): Value error, data.train_files is required"):
        load_config(write(tmp_path, "data:\n  format: text\n"), ["data.seq_len=128"])
    with pytest.raises(ConfigError, match=r"  cluster.aws.region \(from --set\): Input should be a valid string"):
        load_config(write(tmp_path, "data:\n  train_files: [x.json]\n", "c.yaml"), ["cluster.aws.region=1"])


# --------------------------------------------------------------------------- refused at load, before Ray or torch


def errors_of(p, overrides=()):
    """The error lines of a config that does not load (its first line names the file)."""
    with pytest.raises(ConfigError) as e:
        load_config(p, list(overrides))
    first, *rest = str(e.value).splitlines()
    assert first.startswith(f"{p}: invalid config")
    return rest


ALLOWED = "use ASCII letters, digits, '.', '_' and '-'"


def test_a_run_name_refuses_the_first_unsafe_character_with_its_line(tmp_path):
    p = tmp_path / "job.yaml"
    p.write_text("data:\n  train_files: [x.json]\ncheckpoint:\n  name: qwen-é/run\n", encoding="utf-8")
    assert errors_of(p) == [
        f"  checkpoint.name (line 4): Value error, 'é' (U+00E9, character 6) is not allowed in a run name: {ALLOWED} (got 'qwen-é/run')"
    ]
    plain = write(tmp_path, "data:\n  train_files: [x.json]\n", "plain.yaml")
    cases = {
        "a/b": f"'/' (U+002F, character 2) is not allowed in a run name: {ALLOWED}",
        "two words": f"' ' (U+0020, character 4) is not allowed in a run name: {ALLOWED}",
        "tab\there": f"'\\t' (U+0009, character 4) is not allowed in a run name: {ALLOWED}",
        ".hidden": "a run name cannot start with '.' (a hidden directory)",
        "..": "a run name cannot start with '.' (a hidden directory)",
        "x" * 129: "129 characters; a run name has at most 128",
    }
    for name, why in cases.items():
        assert errors_of(plain, [f"checkpoint.name={name}"]) == [f"  checkpoint.name (from --set): Value error, {why} (got {name!r})"]
    with pytest.raises(ConfigError, match=r"checkpoint.name \(line 3\): Value error, a run name cannot be empty"):
        load_config(write(tmp_path, "data:\n  train_files: [x.json]\ncheckpoint: {name: ''}\n", "e.yaml"))
    for ok in ("qwen2.5-1.5b_alpaca", "2024-02-03", "x" * 128, "run.v2"):
        assert load_config(plain, [f"checkpoint.name={ok}"]).checkpoint.name == ok


@pytest.mark.parametrize(
    "body, line",
    [
        ("data:\n  train_files: [x.json]\ncheckpoint:\n  storage_path: ''\n", "  checkpoint.storage_path (line 4): Value error, an empty path: "
         "give a directory (./runs), a shared file system path or an s3:// URI (got '')"),
        ("data:\n  train_files: [x.json, '']\n", "  data.train_files.1 (line 2): Value error, an empty path: give a file, glob, "
         "directory or s3:// URI, or remove the entry (got '')"),
        ("data:\n  train_files: '  '\n", "  data.train_files.0 (line 2): Value error, an empty path: give a file, glob, "
         "directory or s3:// URI, or remove the entry (got '  ')"),
        ("data:\n  train_files: [x.json]\n  validation_files:\n    - v.json\n    - ''\n", "  data.validation_files.1 (line 5): Value error, "
         "an empty path: give a file, glob, directory or s3:// URI, or remove the entry (got '')"),
        ("data:\n  train_files: [x.json]\n  cache_dir: ''\n", "  data.cache_dir (line 3): Value error, an empty path: give a directory, "
         "or null to disable the cache (got '')"),
        ("model:\n  name_or_path: ''\ndata:\n  train_files: [x.json]\n", "  model.name_or_path (line 2): Value error, an empty path: give a hub "
         "id (Qwen/Qwen2.5-1.5B), a model directory or a preset (qwen2-tiny) (got '')"),
        ("model:\n  tokenizer: ''\ndata:\n  train_files: [x.json]\n", "  model.tokenizer (line 2): Value error, an empty path: give a hub id "
         "or a directory, or leave model.tokenizer out for the model's own (got '')"),
    ],
    ids=["storage_path", "train_files_item", "train_files_blank", "validation_files_item", "cache_dir", "name_or_path", "tokenizer"],
)  # fmt: skip
def test_an_empty_path_is_refused_with_its_field_and_line(tmp_path, body, line):
    assert errors_of(write(tmp_path, body)) == [line]


def test_null_still_disables_the_cache_and_real_paths_load(tmp_path):
    cfg = load_config(write(tmp_path, "data:\n  train_files: [x.json]\n  cache_dir: null\ncheckpoint: {storage_path: s3://b/runs}\n"))
    assert cfg.data.cache_dir is None and cfg.checkpoint.storage_path == "s3://b/runs"


# The floor of the activations of one packed micro-batch of qwen2-tiny (2 layers, hidden 64):
# 2 layers × 64 × 2 bytes = 256 bytes per token; at seq_len 2048, 524,288 bytes per row. The
# largest GPU of the catalog is p6-b200.48xlarge's B200, 183,359 MiB = 192,265,846,784 bytes,
# which holds 366,718 such rows and not 366,719.
B200_BYTES = 183_359 * 2**20


def test_a_micro_batch_no_gpu_can_hold_is_refused_at_load_with_the_estimate(tmp_path):
    p = write(tmp_path, "data:\n  train_files: [x.json]\ntrain:\n  micro_batch_size: 1000000000\n")
    assert errors_of(p) == [
        "  train.micro_batch_size (line 4): train.micro_batch_size=1000000000 × data.seq_len=2048 = 2.0e12 tokens per micro-batch "
        "needs ≥ 524 TB of activations (2 layers × hidden size 64 × 2 bytes per token, kept even with activation checkpointing; "
        "preset qwen2-tiny); the largest GPU rayft knows (B200, p6-b200.48xlarge) has 192 GB: lower train.micro_batch_size "
        "(or data.seq_len)"
    ]
    plain = write(tmp_path, "data:\n  train_files: [x.json]\n", "plain.yaml")
    assert B200_BYTES // (2048 * 64 * 2 * 2) == 366_718
    assert load_config(plain, ["train.micro_batch_size=366718"]).train.micro_batch_size == 366_718
    [line] = errors_of(plain, ["train.micro_batch_size=366719"])
    assert line.startswith("  train.micro_batch_size (from --set): train.micro_batch_size=366719 × data.seq_len=2048 = 7.5e8 tokens")
    assert "needs ≥ 192 GB of activations" in line  # 192,266,371,072 bytes, 524,288 more than the B200's


def test_the_memory_floor_follows_the_model_and_the_workers(tmp_path):
    import json

    plain = write(tmp_path, "data:\n  train_files: [x.json]\n")
    big = ["train.micro_batch_size=200000"]  # 4.1e8 tokens at 2048
    # Qwen2.5-7B: 28 layers × hidden 3584 × 2 bytes = 200,704 bytes per token
    [line] = errors_of(plain, big + ["model.name_or_path=qwen2.5-7b"])
    assert "= 4.1e8 tokens per micro-batch needs ≥ 82.2 TB of activations (28 layers × hidden size 3584" in line
    # config_overrides change the shape: one layer of hidden 8 is 16 bytes per token, 6.55 GB here
    assert load_config(plain, big + ['model.config_overrides={"num_hidden_layers": 1, "hidden_size": 8}'])
    # a local model directory is read from its config.json
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 1024, "num_hidden_layers": 16}))
    [line] = errors_of(plain, big + [f"model.name_or_path={d}"])
    assert f"(16 layers × hidden size 1024 × 2 bytes per token, kept even with activation checkpointing; {d / 'config.json'})" in line
    # CPU workers: bounded by the largest machine's memory (2,048 GiB), not a GPU's
    [line] = errors_of(plain, ["train.micro_batch_size=5000000", "train.use_gpu=false"])
    assert line.endswith("the largest machine rayft knows (p5.48xlarge) has 2.2 TB: lower train.micro_batch_size (or data.seq_len)")
    assert load_config(plain, ["train.micro_batch_size=4000000", "train.use_gpu=false"])  # 2.1 TB of 2.2
    # not judged: a hub id (no network at load), and padding mode (micro-batches hold up to micro_batch_size examples)
    assert load_config(plain, ["train.micro_batch_size=1000000000", "model.name_or_path=Qwen/Qwen2.5-1.5B"])
    assert load_config(plain, ["train.micro_batch_size=1000000000", "data.packing=false"])


def test_unknown_keys_suggest_the_closest_known_key_of_their_section(tmp_path):
    p = write(
        tmp_path,
        """\
        traim:
          lr: 0.1
        data:
          trian_files: [x.json]
          train_files: [x.json]
        train:
          micro_batchsize: 4
          lerning_rate: 0.1
        cluster:
          kube: {namespce: ml}
        """,
    )
    with pytest.raises(ConfigError) as e:
        load_config(p, ["data.columns.frm=who"])
    assert str(e.value).splitlines() == [
        f"{p}: invalid config (6 errors)",
        "  data.columns.frm (from --set): unknown key (did you mean 'from'?)",
        "  data.trian_files (line 4): unknown key (did you mean 'train_files'?)",
        "  train.micro_batchsize (line 7): unknown key (did you mean 'micro_batch_size'?)",
        "  train.lerning_rate (line 8): unknown key",  # nothing close enough (the field is lr)
        "  cluster.kube.namespce (line 10): unknown key (did you mean 'namespace'?)",
        "  traim (line 1): unknown key (did you mean 'train'?)",
    ]


@pytest.mark.parametrize(
    "value,why",
    [
        ("[3, 2]", r"FIRST <= LAST and at most 10 steps \(got \[3, 2\]\)"),
        ("[1, 20]", r"at most 10 steps \(got \[1, 20\]\)"),
        ("[0, 1]", r"greater than or equal to 1"),
        ("ten", r"valid tuple"),
    ],
)
def test_a_bad_profile_window_names_the_key_and_line(tmp_path, value, why):
    p = write(tmp_path, f"data:\n  train_files: [x.json]\ntrain:\n  profile_steps: {value}\n")
    with pytest.raises(ConfigError, match=rf"(?s){p.name}: invalid config.*train\.profile_steps(\.0)? \(line 4\): .*{why}"):
        load_config(p)
    assert load_config(write(tmp_path, "data:\n  train_files: [x.json]\ntrain:\n  profile_steps: [10, 11]\n")).train.profile_steps == (
        10,
        11,
    )
