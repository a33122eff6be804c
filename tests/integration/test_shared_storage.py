"""Multi-node storage: a path every node sees passes; a node-local one is refused before training."""

import pytest

from rayft.train import driver, ray_cluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def two_node_ray(embedded_ray):
    import ray
    from ray.cluster_utils import Cluster

    embedded_ray.stop()  # the session's embedded Ray, when a module before this one left it up (see conftest)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_a_path_every_node_sees_passes(two_node_ray, tmp_path):
    import ray

    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    assert ray_cluster.nodes_missing_storage(str(tmp_path / "runs")) == []
    assert list((tmp_path / "runs").iterdir()) == []  # the marker is cleaned up
    assert ray_cluster.nodes_missing_storage("s3://bucket/prefix") == []


def test_node_local_storage_is_refused_before_any_worker(two_node_ray, tmp_path, monkeypatch):
    import json

    from rayft.config_load import load_config

    (tmp_path / "d.jsonl").write_text(
        json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}) + "\n"
    )
    (tmp_path / "job.yaml").write_text("data: {train_files: [d.jsonl]}\ntrain: {num_workers: 1, use_gpu: false}\n")
    cfg = load_config(tmp_path / "job.yaml")
    # on one host every node shares the disk; stand in for a second host that cannot see the path
    monkeypatch.setattr(ray_cluster, "nodes_missing_storage", lambda path: ["10.0.1.7"])
    with pytest.raises(driver.TrainError, match=r"node-local: Ray nodes 10\.0\.1\.7 cannot see it.*FSx for Lustre.*s3://"):
        driver.run_training(cfg)
