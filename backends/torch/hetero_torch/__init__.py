"""hetero-torch: the ``torch`` backend, every op from PyTorch's batched operators on any torch device."""
