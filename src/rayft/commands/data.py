"""`rayft data prepare`: ingest and tokenize a config's data into the token store ahead of training
(:func:`rayft.data.prepare.prepare_data`), with a progress bar; `rayft train` on the same config then
opens the store and tokenizes nothing."""

from __future__ import annotations

import time

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

from rayft.commands.common import ConfigArg, SetOpt, console, fail, load_config_or_exit, say

data_app = typer.Typer(help="Prepare training data ahead of a run.", no_args_is_help=True)


class IngestBar:
    """The ingest's progress (:class:`rayft.data.prepare.Progress`) as a rich bar: input bytes done
    of the total, records/s and tokens/s since the start."""

    def __init__(self, progress: Progress):
        self.progress, self.task, self.t0 = progress, None, time.perf_counter()
        self.records = self.tokens = 0

    def start(self, total_bytes: int) -> None:
        self.t0 = time.perf_counter()
        self.task = self.progress.add_task("ingest", total=max(total_bytes, 1), rates="")

    def advance(self, nbytes: int, records: int, tokens: int) -> None:
        self.records += records
        self.tokens += tokens
        dt = max(time.perf_counter() - self.t0, 1e-9)
        rates = f"{self.records:,} records, {self.records / dt:,.0f} records/s, {self.tokens / dt:,.0f} tokens/s"
        if self.task is not None:
            self.progress.update(self.task, advance=nbytes, rates=rates)


@data_app.command("prepare")
def prepare(config: ConfigArg, set_: SetOpt = None) -> None:
    """Read, validate and tokenize the data into the token store under data.cache_dir, ahead of training.

    Prints the report lines and where the store is; `rayft train` on the same config (and settings) then tokenizes nothing.
    """
    cfg = load_config_or_exit(config, set_)
    if cfg.data.synthetic is not None:
        fail("data.synthetic has nothing to prepare (random tokens are made in memory by rayft train)", 2)
    if not cfg.data.cache_dir:
        fail(
            "data.cache_dir is null: rayft data prepare writes the token store under data.cache_dir, where rayft train "
            "finds it; set data.cache_dir (a shared path or an s3:// URI on a cluster)",
            2,
        )
    from rayft.data.examples import DataError
    from rayft.data.prepare import open_tokenizer, prepare_data
    from rayft.train.errors import TrainError
    from rayft.train.model import default_tokenizer
    from rayft.train.ray_cluster import connect_ray, nodes_missing_storage

    def locate(root: str) -> str:  # on a multi-node cluster the store must be where every node (and the next run) reads it
        import os

        if "://" in root or not (cfg.ray.address or os.environ.get("RAY_ADDRESS")):
            return root
        connect_ray(cfg)
        blind = nodes_missing_storage(root)
        if blind:
            raise DataError(
                f"data.cache_dir={cfg.data.cache_dir} is node-local: Ray nodes {', '.join(blind)} cannot see it; "
                "put it on a file system every node mounts (e.g. /fsx/rayft/tokenized) or an s3://bucket/prefix URI"
            )
        return root

    name = default_tokenizer(cfg.model)
    try:
        tokenizer = open_tokenizer(name, cfg.model.revision, cfg.model.trust_remote_code)
        columns = (
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[rates]}"),
        )
        with Progress(*columns, console=console, transient=True) as bar:
            data = prepare_data(cfg, console, tokenizer, name, connect=lambda: connect_ray(cfg), locate=locate, progress=IngestBar(bar))
    except (DataError, TrainError) as e:
        fail(str(e))
    val = f" and {len(data.validation):,} validation examples" if data.validation is not None else ""
    say(f"data: token store {data.store}: {len(data.train):,} training examples{val}; rayft train {config} uses it without tokenizing")
