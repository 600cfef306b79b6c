"""Exceptions raised by hetero. Every message names what failed and why."""

from __future__ import annotations

__all__ = [
    "HeteroError",
    "OpError",
    "BackendNotFound",
    "BackendUnavailable",
    "BackendIncompatible",
    "OpNotAvailable",
    "CommError",
    "UsageError",
    "ModelNotFound",
    "USER_ERRORS",
]


class HeteroError(Exception):
    """Base class of every error hetero raises on purpose."""


class OpError(HeteroError, ValueError):
    """Bad input to an operator: names the op, the argument, what was expected and what came."""

    def __init__(self, op: str, arg: str, expected: str, got: str):
        self.op, self.arg, self.expected, self.got = op, arg, expected, got
        super().__init__(f"{op}: argument '{arg}': expected {expected}, got {got}")


class BackendNotFound(HeteroError, LookupError):
    """No backend of that name is registered."""

    def __init__(self, name: str, known: list[str], closest: str | None):
        self.name, self.known, self.closest = name, known, closest
        hint = f"; did you mean '{closest}'?" if closest else "."
        known_s = ", ".join(known) if known else "none (no hetero backend package is installed)"
        super().__init__(f"unknown hetero backend '{name}'{hint} Known backends: {known_s}")


class BackendUnavailable(HeteroError, RuntimeError):
    """The backend exists but cannot run here (its probe said why), or its plugin is broken."""

    def __init__(self, name: str, reason: str):
        self.name, self.reason = name, reason
        super().__init__(f"hetero backend '{name}' is unavailable: {reason}")


class BackendIncompatible(BackendUnavailable):
    """The backend implements a spec major version other than this hetero's."""

    def __init__(self, name: str, reason: str):
        super().__init__(name, reason)
        self.args = (f"hetero backend '{name}' is incompatible: {reason}",)


class OpNotAvailable(HeteroError, NotImplementedError):
    """An op the backend does not implement natively, asked for with strict=True or unsupported."""

    def __init__(self, backend: str, op: str, reason: str):
        self.backend, self.op, self.reason = backend, op, reason
        super().__init__(f"{op}: not available natively on backend '{backend}': {reason}")


class CommError(HeteroError, RuntimeError):
    """A collective failed (a peer died, or did not arrive within the timeout), or the process group could not start."""

    def __init__(self, collective: str, rank: int | None, world_size: int | None, timeout: float | None, cause: str):
        self.collective, self.rank, self.world_size, self.timeout, self.cause = (
            collective,
            rank,
            world_size,
            timeout,
            cause,
        )
        where = f"rank {rank} of world size {world_size}" if rank is not None else "this process"
        limit = f"{timeout:g} s" if timeout is not None else "unknown"
        super().__init__(f"{collective}: collective failed on {where} (timeout {limit}): {cause}")


class UsageError(HeteroError, ValueError):
    """A problem with what the user asked for (an argument, a request, a file), not with hetero or a backend.

    The ``hetero`` command prints it as one line, ``hetero <command>: error: <message>``, and
    exits 2. ``arg``, ``expected`` and ``got``, when given, name the bad argument (a Python
    parameter such as ``max_tokens``), what it must be and what came, so a command can say
    which of its options was wrong.
    """

    def __init__(self, message: str, *, arg: str | None = None, expected: str | None = None, got: object = None):
        self.arg, self.expected, self.got = arg, expected, got
        super().__init__(message)


class ModelNotFound(UsageError, FileNotFoundError):
    """The model directory does not exist or is not a Hugging Face checkpoint (no config.json)."""


#: the errors a user can fix: the ``hetero`` command prints them as one line (exit 2), not a traceback
USER_ERRORS = (UsageError, BackendNotFound, BackendUnavailable)
