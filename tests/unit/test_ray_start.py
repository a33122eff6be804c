"""What rayft.train.ray_start relies on in Ray without starting one: Ray Train's controller gets its
autoscaling coordinator from the very function that start_autoscaling_coordinator calls (else the
early start would make an actor nobody asks), and a config that joins a cluster starts nothing."""

from rayft.config import RayftConfig
from rayft.train.ray_start import EmbeddedRayStart


def test_ray_trains_controller_asks_the_coordinator_that_is_started_early():
    from ray.data._internal.cluster_autoscaler import default_autoscaling_coordinator as data_side
    from ray.train.v2._internal.execution.scaling_policy import autoscaling_coordinator_client as train_side

    assert train_side.get_or_create_autoscaling_coordinator is data_side.get_or_create_autoscaling_coordinator
    assert "get_or_create_autoscaling_coordinator()" in open(train_side.__file__).read()


def test_a_run_that_joins_a_cluster_starts_no_ray_of_its_own(monkeypatch):
    cfg = RayftConfig.model_validate({"data": {"train_files": ["unused.jsonl"]}, "ray": {"address": "10.0.0.1:6379"}})
    assert EmbeddedRayStart.begin(cfg) is None
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert EmbeddedRayStart.begin(cfg.model_copy(update={"ray": cfg.ray.model_copy(update={"address": None})})) is None
