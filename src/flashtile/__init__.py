"""flashtile: exact FlashAttention for PyTorch, in Triton, with a blockwise CPU path."""
from .interface import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func, flash_attn_varlen_func,
                        flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func)
from .kvcache import flash_attn_with_kvcache
from .padding import pad_input, unpad_input
from .reference import attention_ref

__version__ = "0.1.0"

_FLEX_NAMES = ("attention", "BlockMask", "create_block_mask", "and_masks", "or_masks", "causal_mask",
               "sliding_window_mask", "document_mask", "prefix_lm_mask", "block_diagonal_mask", "dilated_mask",
               "strided_mask")
try:  # programmable attention compiles the user's mods with triton; the flash_attn_* API runs on CPU without it
    from .flex import (BlockMask, and_masks, attention, block_diagonal_mask, causal_mask, create_block_mask,
                       dilated_mask, document_mask, or_masks, prefix_lm_mask, sliding_window_mask, strided_mask)
except ModuleNotFoundError as exc:
    from .runtime import triton_missing

    if not triton_missing(exc):
        raise
    _no_triton = exc

    def __getattr__(name):
        if name in _FLEX_NAMES:
            raise ImportError(f"flashtile.{name} (programmable attention) needs triton, which is not installed: "
                              f"pip install triton") from _no_triton
        raise AttributeError(f"module 'flashtile' has no attribute {name!r}")

__all__ = ["flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
           "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache",
           "pad_input", "unpad_input", "attention", "BlockMask", "create_block_mask", "and_masks", "or_masks",
           "causal_mask", "sliding_window_mask", "document_mask", "prefix_lm_mask", "block_diagonal_mask",
           "dilated_mask", "strided_mask",
           "attention_ref", "__version__"]
