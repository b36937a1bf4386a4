"""The one exception the trainer expects: a problem the user can fix, shown without traceback."""


class TrainerError(Exception):
    """Bad data, environment or model: `python -m ddp_trainer` prints the message and exits 1."""


# --- a collective that timed out or a peer that went away: not this program's bug ----------
# torch.distributed's own error kinds, and what gloo raises as a plain RuntimeError (read from
# torch 2.15: "Timed out waiting 3000ms for recv operation to complete", "Connection closed by
# peer", both from third_party/gloo/gloo/transport/tcp).
DISTRIBUTED_ERRORS = frozenset({"DistError", "DistBackendError", "DistNetworkError"})
LOST_PEER_MARKERS = ("gloo/transport/", "Connection closed by peer", "Connection reset by peer")


def is_peer_lost(exc: BaseException) -> bool:
    """Whether `exc` says a collective timed out or another rank went away."""
    if any(kind.__name__ in DISTRIBUTED_ERRORS for kind in type(exc).__mro__):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in LOST_PEER_MARKERS)
