"""What `rayft bench`'s options offer and default to, in a module that imports nothing heavy.

`rayft` loads every command's options at its start (``rayft --help``, ``rayft train``, ...); the
benchmarks' modules (numpy, the NCCL doctor, the instance catalog) are imported by the bench
commands only when they run.
"""

from __future__ import annotations

from enum import Enum

#: Every recipe `rayft bench train` knows, in the order its tables list them.
RECIPES = ("sample-recipe", "trl-default", "trl-best", "rayft", "rayft-fp8", "torchtitan", "torchtitan-fp8", "llamafactory")
#: What ``--recipes`` defaults to (``rayft-fp8``, the torchtitan recipes, which need
#: ``pip install torchtitan==0.2.2``, and ``llamafactory`` are asked for by name).
DEFAULT_RECIPES = ("sample-recipe", "trl-default", "trl-best", "rayft")
RAYFT_RECIPES = ("rayft", "rayft-fp8")
TRL_RECIPES = ("trl-default", "trl-best")
#: Random token rows, and the config's real data.
WORKLOADS = ("random", "real")

#: `rayft bench train`'s optimizer steps per run, and the leading ones left out of every figure.
DEFAULT_STEPS = 30
DEFAULT_WARMUP = 5
#: Seconds of bf16 products that measure the GPU's sustained matrix rate before the recipes run
#: (:mod:`rayft.benchmarks.ceiling`); 0 skips it.
DEFAULT_CEILING_S = 15.0


class Mode(str, Enum):
    """`rayft bench fabric`'s comparison: NVLink against sockets on one host, or EFA against sockets."""

    ONEHOST = "onehost"
    EFA = "efa"
