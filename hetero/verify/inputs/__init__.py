"""Input builders of the cases: each draws one op's arguments on the CPU from a case's generator.

A builder (``attention.paged(...)``, ``gemm.scaled(...)``, ...) returns a ``Builder``
(``(generator, dtype) -> arguments``) for one shape; the conformance catalog
(``hetero_conformance.cases``) and ``hetero bench``'s performance shapes (``hetero.bench.perf``)
are lists of cases made with them. ``draw`` holds the random primitives (never zeros);
``paged``, ``recurrent_draw``, ``dsa_draw`` and ``quant_draw`` what several families share.
"""
