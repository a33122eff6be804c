"""Issue 23, bench/NOTES.md §43: CopyingAdamW (``train.one_pass_adamw``) against torch's AdamW on the same
compute-copy model (qwen2.5-0.5b, 4 layers, eager attention: tests/gpu's helpers), two steps side by side:
each step's loss and gradient norm, then the four parameters whose values differ most between the two
(max |Δw| over the parameter's max |w|, the share of elements apart by more than 1e-7 of it, the same
for AdamW's two moments, both step counts and the group's weight decay). On the GPU host, from the repo
root: ``source bench/gpu/host_prelude.sh; python3 bench/gpu/copying_adamw_diag.py``.
"""

import os
import sys


def main() -> None:
    import torch.distributed as dist

    sys.path.insert(0, "tests/gpu")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29534")
    dist.init_process_group("nccl", rank=0, world_size=1)
    import test_compute_copy_gpu as t

    from rayft.config import TrainConfig
    from rayft.train.optim import build_optimizer
    from rayft.train.step import train_step

    models = {}
    for mode in ("torch", "one_pass"):
        m = t._model("compute_copy", attn="eager")
        opt = build_optimizer(m.module, TrainConfig(lr=1e-4), t.CUDA)
        if mode == "one_pass":
            assert m.use_copying_adamw(opt) is None
        models[mode] = (m, opt)
    for step in range(2):
        for mode, (m, opt) in models.items():
            bs = t._batches(10 + step)
            r = train_step(m, opt, bs, float(sum(int(b["num_trainable"]) for b in bs)), max_grad_norm=1.0)
            print(step, mode, "loss", r.loss, "norm", r.grad_norm, flush=True)
        (ma, oa), (mb, ob) = models["torch"], models["one_pass"]
        worst = []
        for (name, pa), pb in zip(ma.module.named_parameters(), mb.module.parameters()):
            d = (pa.detach().float() - pb.detach().float()).abs()
            sa, sb = oa.state[pa], ob.state[pb]
            scale = max(pa.abs().max().item(), 1e-30)
            dm = (sa["exp_avg"] - sb["exp_avg"]).abs().max().item() / max(sa["exp_avg"].abs().max().item(), 1e-30)
            dv = (sa["exp_avg_sq"] - sb["exp_avg_sq"]).abs().max().item() / max(sa["exp_avg_sq"].abs().max().item(), 1e-30)
            wd = [g["weight_decay"] for g in oa.param_groups if any(q is pa for q in g["params"])]
            worst.append(
                (d.max().item() / scale, (d > 1e-7 * scale).float().mean().item(), dm, dv, name, float(sa["step"]), float(sb["step"]), wd)
            )
        worst.sort(reverse=True)
        for w in worst[:4]:
            print(step, "rel|dw|max %.2e frac>1e-7 %.3f rel dm %.2e rel dv %.2e %s steps %s/%s wd %s" % w, flush=True)


if __name__ == "__main__":
    main()
