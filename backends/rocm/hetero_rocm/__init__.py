"""hetero-rocm: hetero's operators on AMD Instinct GPUs (Triton kernels tuned for CDNA, hipBLASLt, aiter, RCCL)."""

__version__ = "0.1.0"
