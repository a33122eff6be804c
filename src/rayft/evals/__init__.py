"""`rayft eval`: a run's model scored on lm-evaluation-harness tasks (:mod:`rayft.evals.harness`;
the model found from a run or HF directory by :func:`rayft.infer.model_dir.model_dir`), and
rayft's own offline tasks (``tasks/``: YAML task configs beside their JSONL data)."""


class EvalError(RuntimeError):
    """An evaluation that cannot run: no model at the path, an unknown task, a task whose data
    cannot be fetched. The message names the path or the task."""
