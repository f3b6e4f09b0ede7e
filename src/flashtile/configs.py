"""Tile configurations as data, chosen by (arch, head dim, local (causal or window), dtype).

Each entry names the measurement that justified it (docs/perf-log.md). Under the Triton
interpreter a single small configuration is used: the interpreter runs programs one by one
on the CPU, and only correctness matters there.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class TileConfig:
    """One kernel's tiles (BLOCK_M queries x BLOCK_N keys), warps and software-pipelining depth."""
    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class BwdConfig:
    """The backward's two main kernels are tuned apart: dK/dV (keys resident) and dQ (queries resident)."""
    dkdv: TileConfig
    dq: TileConfig


def _bwd(m1, n1, m2, n2, warps, stages):
    return BwdConfig(TileConfig(m1, n1, warps, stages), TileConfig(m2, n2, warps, stages))


INTERPRETER_FWD = TileConfig(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1)
INTERPRETER_BWD = _bwd(32, 32, 32, 32, 4, 1)

# Hopper (sm90) configurations keyed by padded head dim. Measured on the H200 with
# benchmarks/tune.py; see docs/perf-log.md for the numbers behind each choice.
# Sweep of 2026-11-29 (bf16, seqlen 4096, 16K tokens): perf-log.md, "v1 tile sweep".
_SM90_FWD = {
    16: TileConfig(128, 64, 4, 3),
    32: TileConfig(128, 64, 4, 3),
    64: TileConfig(128, 64, 4, 3),  # 383 TFLOP/s (128x128: 369; 8 warps: 349)
    128: TileConfig(128, 64, 8, 3),  # 466 (128x128: 465; 4 warps: 208)
    256: TileConfig(128, 64, 8, 2),  # 454 (3 stages does not fit in shared memory)
}
_SM90_BWD = {
    16: _bwd(64, 64, 64, 64, 4, 3),
    32: _bwd(64, 64, 64, 64, 4, 3),
    64: _bwd(64, 64, 64, 64, 4, 3),  # 355 (64/128 tiles, 8 warps: 335)
    128: _bwd(64, 128, 128, 64, 8, 2),  # 353 (64x64, 4 warps: 350)
    256: _bwd(32, 32, 32, 32, 4, 2),  # 149: below FA2, see perf-log.md
}

# Every other GPU: conservative tiles that fit ~100 KB of shared memory (Ampere/Ada class).
_GENERIC_FWD = {
    16: TileConfig(128, 64, 4, 2),
    32: TileConfig(128, 64, 4, 2),
    64: TileConfig(128, 64, 4, 2),
    128: TileConfig(128, 64, 8, 2),
    256: TileConfig(64, 32, 4, 1),
}
_GENERIC_BWD = {
    16: _bwd(32, 64, 64, 32, 4, 2),
    32: _bwd(32, 64, 64, 32, 4, 2),
    64: _bwd(32, 64, 64, 32, 4, 2),
    128: _bwd(32, 64, 64, 32, 4, 1),
    256: _bwd(16, 32, 32, 16, 4, 1),
}


def _table_for(arch, dtype, sm90, generic):
    # fp32 tiles take twice the shared memory: they get the conservative table everywhere.
    is_fp32 = dtype is not None and dtype.itemsize == 4
    return sm90 if arch is not None and arch >= (9, 0) and not is_fp32 else generic


def fwd_config(arch, head_dim_padded, local, dtype, interpreter=False):
    """The forward tile configuration. arch is (major, minor) of the CUDA device, or None."""
    if interpreter:
        return INTERPRETER_FWD
    return _table_for(arch, dtype, _SM90_FWD, _GENERIC_FWD)[head_dim_padded]


def bwd_config(arch, head_dim_padded, local, dtype, interpreter=False):
    """The backward tile configuration (dK/dV and dQ kernels)."""
    if interpreter:
        return INTERPRETER_BWD
    return _table_for(arch, dtype, _SM90_BWD, _GENERIC_BWD)[head_dim_padded]
