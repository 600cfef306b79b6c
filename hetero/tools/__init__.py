"""The engine's tools, apart from its runtime (``hetero.engine``).

* :mod:`~hetero.tools.cli`: ``hetero generate``, ``check-model``, ``quantize`` and ``bench-engine``;
* :mod:`~hetero.tools.check`: check-model, the engine's logits against transformers';
* :mod:`~hetero.tools.replay`: check-model ``--per-op``, each recorded op call judged by ``hetero.verify``;
* :mod:`~hetero.tools.profile`: ``hetero profile``, where a step's time goes;
* :mod:`~hetero.tools.quantize`: offline fp8 / int8 / W4A16 (int4, via compressed-tensors) quantization of a checkpoint;
* :mod:`~hetero.tools.tiny`: tiny random checkpoints of every architecture (``python -m hetero.tools.tiny``).

Tools import the engine; the engine never imports a tool.
"""
