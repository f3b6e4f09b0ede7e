"""fp32's dot precision in the kernels (DOT_PRECISION): PyTorch's TF32 switch, and tf32x3 where TF32 is fast.

The launchers read it as launch._dot_precision (re-exported there), the name tests and benchmarks patch.
"""
import torch


def _tf32_matmuls():
    """PyTorch's switch for TF32 in fp32 matmuls: torch.backends.cuda.matmul.fp32_precision where it exists (torch
    2.9+; "none" defers to torch.backends.fp32_precision, whose "none" is ieee), else allow_tf32. The legacy flag
    follows the new setting, but reading it raises once a program has set the new one (torch 2.13)."""
    matmul = torch.backends.cuda.matmul
    precision = getattr(matmul, "fp32_precision", None)
    if precision is None:
        return matmul.allow_tf32
    if precision == "none":
        precision = getattr(torch.backends, "fp32_precision", "none")
    return precision == "tf32"


# NVIDIA GPUs whose TF32 tensor cores run 7-8x their FP32 FMA rate (A100, H100 / H200, B200): three TF32 products
# per fp32 product beat FMA dots there (2.9-6.5x on the H200). GeForce-class parts (sm86 / sm89 / sm120) run TF32 at
# 1-2x their FP32 rate, where tf32x3 would likely lose; not measured, so they keep FMA dots.
TF32X3_ARCHS = ((8, 0), (9, 0), (10, 0), (10, 3))


def _dot_precision(dtype, arch):
    """The kernels' DOT_PRECISION (fp16 / bf16 ignore it). fp32 follows PyTorch's TF32 switch: on, TF32 tensor-core
    dots; off (PyTorch's default), fp32-level accuracy: "tf32x3" (each product as three TF32 ones, CUTLASS's 3xTF32,
    which SDPA's fp32 kernel uses too) on TF32X3_ARCHS, 2.9-6.5x faster than FMA dots on the H200 with errors as small
    (docs/perf-log.md, sessions 21-22); FMA dots ("ieee") elsewhere (other GPUs, ROCm, CPU tensors)."""
    if torch.version.hip is not None:
        # ROCm's Triton takes "tf32" on gfx942 alone (MI200 refuses it even for 16-bit operands, which ignore it):
        # FMA dots for fp32 (configs' _IEEE_* tiles), and fp16 / bf16 dots as any precision gives them.
        return "ieee"
    if dtype != torch.float32 or _tf32_matmuls():
        return "tf32"
    if arch in TF32X3_ARCHS:
        return "tf32x3"
    return "ieee"
