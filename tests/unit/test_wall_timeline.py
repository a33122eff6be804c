"""The driver's breakdown of a run's wall time (rayft_summary.json's wall_s)."""


def test_wall_timeline_splits_a_run_at_its_marks():
    from rayft.train.summary import wall_timeline

    marks = {"start": 100.0, "ray_wait": 100.5, "ray_ready": 103.0, "checks_start": 103.0, "fit_called": 104.0, "fit_returned": 200.0}
    first = {"worker_entry_unix": 130.0, "worker_args_unix": 132.0, "time_setup_s": 6.0, "step_time_s": 12.0, "unix_time": 150.0}
    history = [first, {"unix_time": 180.0}]
    assert wall_timeline(marks, history) == {
        "data": 0.5,
        "ray": 2.5,
        "checks": 1.0,
        "workers_start": 26.0,
        "data_wait": 2.0,
        "worker_setup": 6.0,
        "first_step": 12.0,
        "checkpoint_buffers": 0.0,
        "steps": 30.0,
        "end": 20.0,
        "total": 100.0,
    }
    assert sum(v for k, v in wall_timeline(marks, history).items() if k != "total") == 100.0  # no gap between the phases
    assert wall_timeline(marks, [{"unix_time": 1.0}]) is None  # metrics of an older rayft: no breakdown


def test_a_worker_that_did_not_wait_for_its_arguments_has_no_data_wait():
    """A first step recorded by a worker whose arguments were there at once (or an older rayft's,
    without ``worker_args_unix``): the phases still add up, with no wait for the data."""
    from rayft.train.summary import wall_timeline

    marks = {"start": 100.0, "ray_wait": 100.0, "ray_ready": 103.0, "checks_start": 103.0, "fit_called": 104.0, "fit_returned": 200.0}
    first = {"worker_entry_unix": 130.0, "time_setup_s": 6.0, "step_time_s": 12.0, "unix_time": 148.0}
    wall = wall_timeline(marks, [first, {"unix_time": 180.0}])
    assert (wall["workers_start"], wall["data_wait"], wall["steps"]) == (26.0, 0.0, 32.0)
    assert sum(v for k, v in wall.items() if k != "total") == wall["total"] == 100.0


def test_a_data_phase_before_the_workers_start_is_on_the_runs_path():
    """On a store hit the data phase runs beside Ray's start, then the driver waits for what is left
    of it, checks and calls ``fit``; where the workers start from inside the data phase, the
    tokenization after that is in no phase."""
    from rayft.train.summary import wall_timeline

    hit = {"start": 100.0, "ray_wait": 105.0, "ray_ready": 106.0, "checks_start": 106.0, "fit_called": 108.0, "fit_returned": 200.0}
    first = {"worker_entry_unix": 120.0, "worker_args_unix": 120.0, "time_setup_s": 6.0, "step_time_s": 12.0, "unix_time": 138.0}
    wall = wall_timeline(hit, [first, {"unix_time": 180.0}])
    assert (wall["data"], wall["ray"], wall["checks"], wall["workers_start"]) == (5.0, 1.0, 2.0, 12.0)
    assert sum(v for k, v in wall.items() if k != "total") == wall["total"] == 100.0
    # a miss tokenized here: the hook at 103 s waits 1 s for Ray, checks 1 s, calls fit; the data go on to 111 s
    miss = {"start": 100.0, "ray_wait": 103.0, "ray_ready": 104.0, "checks_start": 104.0, "fit_called": 105.0, "fit_returned": 200.0}
    first = {"worker_entry_unix": 117.0, "worker_args_unix": 117.5, "time_setup_s": 6.0, "step_time_s": 12.0, "unix_time": 135.5}
    wall = wall_timeline(miss, [first, {"unix_time": 180.0}])
    assert (wall["data"], wall["ray"], wall["checks"], wall["workers_start"], wall["data_wait"]) == (3.0, 1.0, 1.0, 12.0, 0.5)
    assert sum(v for k, v in wall.items() if k != "total") == wall["total"] == 100.0


def test_the_async_checkpoint_buffers_after_the_first_step_are_their_own_phase():
    """The pinned buffers of async saves are allocated after the first step, before its metrics'
    timestamp: without their own phase the breakdown would miss them (178 s for Mistral-7B)."""
    from rayft.train.summary import wall_timeline

    marks = {"start": 100.0, "ray_wait": 100.0, "ray_ready": 110.0, "checks_start": 110.0, "fit_called": 110.0, "fit_returned": 200.0}
    first = {
        "worker_entry_unix": 140.0,
        "worker_args_unix": 140.0,
        "time_setup_s": 6.0,
        "step_time_s": 12.0,
        "time_prestage_s": 5.0,
        "unix_time": 163.0,
    }
    wall = wall_timeline(marks, [first, {"unix_time": 180.0}])
    assert (wall["checkpoint_buffers"], wall["steps"], wall["end"]) == (5.0, 17.0, 20.0)
    assert sum(v for k, v in wall.items() if k != "total") == wall["total"] == 100.0
