#!/bin/bash
# One device call on nvidia-h200-x2 (~570 s): `rayft bench train` on both workloads, each with the
# recipes its targets compare (issue #4): random rows — rayft vs sample-recipe; real alpaca EN+ZH —
# rayft vs trl-default vs trl-best. Two bench invocations, so each workload keeps its own deadline.
#   RAYFT_GIT_COMMIT=<sha> bash bench/gpu/session_c.sh
# Writes under $OUT (6 files): train-bench-{random,real}.json, bench-{random,real}.log,
# run-logs-{random,real}.tar.gz (see bench_train.sh).
set -u
WORKLOAD=random RECIPES=rayft,sample-recipe RUN_TIMEOUTS=rayft=150,sample-recipe=110 DEADLINE_S=225 BENCH_TIMEOUT=240 \
  bash bench/gpu/bench_train.sh; a=$?
WORKLOAD=real RECIPES=rayft,trl-default,trl-best RUN_TIMEOUTS=rayft=130,trl-default=110,trl-best=110 DEADLINE_S=290 BENCH_TIMEOUT=305 \
  bash bench/gpu/bench_train.sh; b=$?
echo "exit: random $a, real $b"
exit $(( a > b ? a : b ))
