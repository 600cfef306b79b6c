"""The portable expert-parallel ops, public for backends to bind or to fall back to.

``ep_dispatch`` and ``ep_combine`` are written once over a ``Communicator`` in device-agnostic
torch (the reference and ``TritonBackend`` bind them); ``check_dispatch`` is their argument check.
A backend with its own collective kernel hands the calls it cannot serve to these.
"""

from __future__ import annotations

from hetero._ep import check_dispatch, ep_combine, ep_dispatch

__all__ = ["ep_dispatch", "ep_combine", "check_dispatch"]
