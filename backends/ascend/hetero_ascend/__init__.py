"""hetero-ascend: hetero's operators on Huawei Ascend NPUs (torch_npu fused ops, triton-ascend kernels, HCCL)."""

__version__ = "0.1.0"
