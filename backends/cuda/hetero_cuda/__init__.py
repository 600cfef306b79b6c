"""hetero-cuda: hetero's operators on NVIDIA GPUs (Triton kernels, cuBLAS / torch / flash-attn where faster, NCCL)."""

__version__ = "0.1.0"
