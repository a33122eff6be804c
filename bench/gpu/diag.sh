#!/bin/bash
# Diagnostics: the same step standalone (with clipping) and inside Ray Train, with a per-step time breakdown.
source .gpu/setup.sh >/dev/null
timeout 150 python3 bench/gpu/profile_step.py --clip --no-profile 2>&1 | grep -E "ms/step|collate"
STEPS=30 TRAIN_TIMEOUT=300 bash bench/gpu/issue2_train.sh > /tmp/t.log 2>&1
grep -E "step |data:" /tmp/t.log | tail -3
python3 -c "
import json
for l in open('/tmp/runs/issue2/rayft_metrics.jsonl'):
    d=json.loads(l); print(d['step'], {k:round(v,3) for k,v in d.items() if k.startswith('time_') or k in ('step_time_s',)}, round(d['tokens_per_s_per_gpu']))
"
