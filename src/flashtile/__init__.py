"""flashtile: exact FlashAttention for PyTorch, in Triton, with a blockwise CPU path."""
from .interface import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func
from .reference import attention_ref

__version__ = "0.1.0"

__all__ = ["flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func", "attention_ref",
           "__version__"]
