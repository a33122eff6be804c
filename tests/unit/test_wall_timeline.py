"""The driver's breakdown of a run's wall time (rayft_summary.json's wall_s)."""


def test_wall_timeline_splits_a_run_at_its_marks():
    from rayft.train.summary import wall_timeline

    marks = {"start": 100.0, "data_ready": 103.0, "ray_ready": 110.0, "fit_called": 111.0, "fit_returned": 200.0}
    history = [{"worker_entry_unix": 140.0, "time_setup_s": 6.0, "step_time_s": 12.0, "unix_time": 158.0}, {"unix_time": 180.0}]
    assert wall_timeline(marks, history) == {
        "data": 3.0,
        "ray": 7.0,
        "workers_start": 29.0,
        "worker_setup": 6.0,
        "first_step": 12.0,
        "steps": 22.0,
        "end": 20.0,
        "total": 100.0,
    }
    assert wall_timeline(marks, [{"unix_time": 1.0}]) is None  # metrics of an older rayft: no breakdown
