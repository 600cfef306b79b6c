"""hetero-cpu-ref: the reference implementation of every hetero op in plain PyTorch."""

__version__ = "0.1.0"
