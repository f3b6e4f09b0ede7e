"""Programmable attention: user score_mod / mask_mod functions and block-sparse FlashAttention."""
from ..kernels.common import _tanh as tanh
from .api import attention
from .block_mask import BlockMask, create_block_mask
from .masks import (and_masks, block_diagonal_mask, causal_mask, dilated_mask, document_mask, or_masks,
                    prefix_lm_mask, sliding_window_mask, strided_mask)
from .mods import Mod

__all__ = ["attention", "BlockMask", "create_block_mask", "Mod", "and_masks", "or_masks", "causal_mask",
           "sliding_window_mask", "document_mask", "prefix_lm_mask", "block_diagonal_mask", "dilated_mask",
           "strided_mask", "tanh"]
