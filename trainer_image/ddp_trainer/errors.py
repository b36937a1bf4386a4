"""The one exception the trainer expects: a problem the user can fix, shown without traceback."""


class TrainerError(Exception):
    """Bad data, environment or model: `python -m ddp_trainer` prints the message and exits 1."""
