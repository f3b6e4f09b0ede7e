"""flashtile: exact FlashAttention for PyTorch, in Triton, with a blockwise CPU path."""
from .interface import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func, flash_attn_varlen_func,
                        flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func)
from .kvcache import flash_attn_with_kvcache
from .padding import pad_input, unpad_input
from .reference import attention_ref

__version__ = "0.1.0"

__all__ = ["flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
           "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache",
           "pad_input", "unpad_input",
           "attention_ref", "__version__"]
