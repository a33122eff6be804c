"""rayft.train.ray_trainer: the controller's poll interval, and no placement-group cleaner on an
embedded Ray. The guards on Ray Train's private names fail here first when an upgrade moves them.
The integration tests that run `rayft train` as a process (its own embedded Ray) train through the
subclass; `make_trainer` is what the driver calls."""

import pytest

from rayft.train.ray_cluster import EMBEDDED
from rayft.train.ray_trainer import POLL_INTERVAL_ENV, POLL_INTERVAL_S, make_trainer, set_poll_interval, trainer_class


def test_poll_interval_is_set_unless_the_user_set_it(monkeypatch):
    import os

    monkeypatch.delenv(POLL_INTERVAL_ENV, raising=False)
    restore = set_poll_interval()
    assert os.environ[POLL_INTERVAL_ENV] == POLL_INTERVAL_S == "0.5"
    restore()
    assert POLL_INTERVAL_ENV not in os.environ  # as it was before the run
    monkeypatch.setenv(POLL_INTERVAL_ENV, "3")
    restore = set_poll_interval()
    assert os.environ[POLL_INTERVAL_ENV] == "3"
    restore()
    assert os.environ[POLL_INTERVAL_ENV] == "3"


def test_ray_train_reads_and_propagates_that_variable():
    """The controller runs in its own process: the driver's value reaches it only through Ray Train's
    list of variables it copies there."""
    from ray.train.v2._internal.constants import ENV_VARS_TO_PROPAGATE, HEALTH_CHECK_INTERVAL_S_ENV_VAR

    assert HEALTH_CHECK_INTERVAL_S_ENV_VAR == POLL_INTERVAL_ENV
    assert POLL_INTERVAL_ENV in ENV_VARS_TO_PROPAGATE


def callbacks_of(cls):
    from ray.train import ScalingConfig

    trainer = cls(lambda: None, scaling_config=ScalingConfig(num_workers=1))
    return trainer._create_default_callbacks()


def test_a_cluster_run_keeps_ray_trains_trainer():
    from ray.train.torch import TorchTrainer

    assert trainer_class(embedded=False) is TorchTrainer


def test_an_embedded_run_leaves_out_only_the_cleaner():
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

    cls = trainer_class(embedded=True)
    assert cls is not TorchTrainer and issubclass(cls, TorchTrainer)
    default = callbacks_of(TorchTrainer)
    ours = callbacks_of(cls)
    # the guard: Ray Train still adds the cleaner by default (else this change is a no-op to revisit)
    assert sum(isinstance(c, PlacementGroupCleanerCallback) for c in default) == 1
    assert not any(isinstance(c, PlacementGroupCleanerCallback) for c in ours)
    assert [type(c) for c in ours] == [type(c) for c in default if not isinstance(c, PlacementGroupCleanerCallback)]
    assert len(ours) == len(default) - 1 >= 3


@pytest.mark.parametrize("where", [EMBEDDED, "existing", "ray://10.0.0.1:10001", "auto"])
def test_make_trainer_by_where_ray_is(where, monkeypatch):
    """What the driver builds: the subclass only for the embedded Ray that connect_ray started; the
    poll interval set for fit() and put back by the run's cleanup."""
    import contextlib
    import os

    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    monkeypatch.delenv(POLL_INTERVAL_ENV, raising=False)
    with contextlib.ExitStack() as cleanup:
        trainer = make_trainer(where, cleanup, lambda: None, scaling_config=ScalingConfig(num_workers=1))
        assert os.environ[POLL_INTERVAL_ENV] == "0.5"
        assert isinstance(trainer, TorchTrainer)
        assert (type(trainer) is not TorchTrainer) == (where == EMBEDDED)
        assert trainer.scaling_config.num_workers == 1
    assert POLL_INTERVAL_ENV not in os.environ
