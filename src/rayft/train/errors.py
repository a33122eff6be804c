"""The training layer's error."""


class TrainError(RuntimeError):
    """The job cannot start or did not finish; the message says why."""
