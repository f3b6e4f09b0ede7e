"""Argument checks of the public API: each bad input raises naming the argument, what it got, what it expects."""
import math
import numbers

import torch
from torch.utils.weak import WeakIdKeyDictionary

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


def _is_int(x):
    """An integer, not a bool. The exact-type test comes first: an ABC isinstance check costs ~0.5 us, and
    these checks run on every call."""
    return type(x) is int or (not isinstance(x, bool) and isinstance(x, numbers.Integral))


def _is_real(x):
    """A real number, not a bool (fast path for float and int as in _is_int)."""
    return type(x) is float or type(x) is int or (not isinstance(x, bool) and isinstance(x, numbers.Real))


def check_tensor(name, t, rank, layout, no_tokens_ok=False):
    """no_tokens_ok: packed varlen tokens (total, heads, headdim) may count 0 tokens (an all-padding batch)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"{name} must have {rank} dimensions {layout}, got shape {tuple(t.shape)}")
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} has dtype {t.dtype}; expected torch.float16, torch.bfloat16 or torch.float32")
    if t.numel() == 0 and not (no_tokens_ok and min(t.shape[1:]) > 0):
        dims = "every dimension but the tokens'" if no_tokens_ok else "every dimension"
        raise ValueError(f"{name} is empty (shape {tuple(t.shape)}); {dims} must be at least 1")
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must have stride 1 in its last (head) dimension, got strides {t.stride()}; "
                         f"call .contiguous() first")


def writable_cache(name, t):
    """A KV cache the call appends to in place: an expanded one (stride 0 over a dim of size > 1, e.g. one row
    broadcast to the batch by .expand) would have several of its entries written to one memory location."""
    for dim, (size, stride) in enumerate(zip(t.shape, t.stride())):
        if stride == 0 and size > 1:
            raise ValueError(f"{name} is expanded (stride 0 in dim {dim} of size {size}): appending would write "
                             f"several of its entries to one memory location; give it storage of its own "
                             f"(e.g. .clone())")


def plain_qkv_ok(q, k, v, same_batch=True):
    """True when dense q, k, v pass check_qkv (same_batch as there: False for a paged cache): the common call checked
    in one pass of exact-type and size tests (host time); False sends the call to check_qkv, which raises the error or
    accepts what this does not test for (tensor subclasses)."""
    T = torch.Tensor
    if type(q) is not T or type(k) is not T or type(v) is not T:
        return False
    qs, ks = q.shape, k.shape
    if len(qs) != 4 or len(ks) != 4 or v.shape != ks or 0 in qs or 0 in ks:
        return False
    dtype = q.dtype
    if k.dtype != dtype or v.dtype != dtype or dtype not in SUPPORTED_DTYPES:
        return False
    if q.stride(3) != 1 or k.stride(3) != 1 or v.stride(3) != 1:
        return False
    head_dim, heads_kv = qs[3], ks[2]
    if ((same_batch and ks[0] != qs[0]) or ks[3] != head_dim or qs[2] % heads_kv or head_dim % 8
            or head_dim > MAX_HEAD_DIM):
        return False
    if q.is_cuda:  # one CUDA device (get_device: an int, where .device builds an object)
        return k.is_cuda and v.is_cuda and k.get_device() == q.get_device() and v.get_device() == q.get_device()
    return q.is_cpu and k.is_cpu and v.is_cpu


def check_qkv(q, k, v, varlen=False, same_batch=True, names=("k", "v"), kv_layout=None):
    """Validate q, k, v against each other: dense (B, S, H, D), or varlen (total, H, D) packed tokens.
    same_batch=False for a paged KV cache, whose first dim counts pages. names: k's and v's in the messages
    (("k_cache", "v_cache") for a KV cache); kv_layout: their layout in the messages where it is not q's (pages)."""
    rank, layout = (3, "(total_tokens, heads, headdim)") if varlen else (4, "(batch, seqlen, heads, headdim)")
    kn, vn = names
    for name, t in (("q", q), (kn, k), (vn, v)):
        check_tensor(name, t, rank, layout if name == "q" else kv_layout or layout, no_tokens_ok=varlen)
    for name, t in ((kn, k), (vn, v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but q has {q.dtype}; q, {kn} and {vn} must share one dtype")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; q, {kn} and {vn} must be on one device")
    if k.shape != v.shape:
        raise ValueError(f"{kn} and {vn} must have the same shape, got {kn} {tuple(k.shape)} and {vn} "
                         f"{tuple(v.shape)}")
    if not varlen and same_batch and k.shape[0] != q.shape[0]:
        raise ValueError(f"{kn} has batch size {k.shape[0]} but q has {q.shape[0]}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"{kn} has head dim {k.shape[-1]} but q has {q.shape[-1]}; they must be equal")
    heads_q, heads_kv = q.shape[-2], k.shape[-2]
    if heads_q % heads_kv != 0:
        raise ValueError(f"the number of query heads ({heads_q}) must be a multiple of the number of "
                         f"key/value heads ({heads_kv}) for MQA/GQA")
    head_dim = q.shape[-1]
    if head_dim % 8 != 0 or head_dim > MAX_HEAD_DIM:
        raise ValueError(f"head dim must be a multiple of 8 between 8 and {MAX_HEAD_DIM}, got {head_dim}")
    if not (q.is_cuda or q.is_cpu):  # not q.device.type: that builds a device object and a string
        raise ValueError(f"q is on {q.device}; flashtile runs on CUDA GPUs and on the CPU")


def check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q, k, key_capacity=None, shared=False):
    """cu_seqlens: int32 (batch + 1,) offsets from 0 to the token count, non-decreasing; max_seqlen: ints that
    bound every sequence (they size the grid). The value checks read the offsets (one device sync per
    cu_seqlens tensor, see read_back); they are skipped while torch.compile traces, where reading values
    would break the graph, and during CUDA graph capture.
    key_capacity (paged keys): no key token count to end at; each key sequence must fit in it instead.
    shared: one cu_seqlens and max_seqlen for queries and keys (the qkvpacked call), named so in the messages.
    Returns the two offsets as the kernels read them (unit_stride) and the two max_seqlen as Python ints."""
    cu_names = ("cu_seqlens",) * 2 if shared else ("cu_seqlens_q", "cu_seqlens_k")
    max_names = ("max_seqlen",) * 2 if shared else ("max_seqlen_q", "max_seqlen_k")
    for name, cu in zip(cu_names, (cu_seqlens_q, cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
        if cu.dtype != torch.int32:
            raise TypeError(f"{name} has dtype {cu.dtype}; expected torch.int32")
        if cu.dim() != 1 or cu.numel() < 2:
            raise ValueError(f"{name} must have shape (batch + 1,) with batch >= 1, got {tuple(cu.shape)}")
        if cu.device != q.device:
            raise ValueError(f"{name} is on {cu.device} but q is on {q.device}")
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), got "
                         f"{cu_seqlens_q.numel()} and {cu_seqlens_k.numel()}")
    for name, value in zip(max_names, (max_seqlen_q, max_seqlen_k)):
        if not _is_int(value):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    max_seqlen_q, max_seqlen_k = int(max_seqlen_q), int(max_seqlen_k)  # numpy integers as Python ints
    compiling = torch.compiler.is_compiling()
    for keys, (name, max_name, cu, tokens, max_len) in enumerate(zip(
            cu_names, max_names, (cu_seqlens_q, cu_seqlens_k), (q.shape[0], k.shape[0]), (max_seqlen_q, max_seqlen_k))):
        if compiling or capturing(cu):
            continue
        offsets = read_back(cu)
        if offsets[0] != 0:
            raise ValueError(f"{name} must start at 0, got {offsets[0]}")
        lengths = [b - a for a, b in zip(offsets, offsets[1:])]
        if min(lengths) < 0:
            raise ValueError(f"{name} must be non-decreasing, got {offsets}")
        if key_capacity is not None and keys:
            if max(lengths) > key_capacity:
                raise ValueError(f"cu_seqlens_k has a sequence of {max(lengths)} keys but block_table holds "
                                 f"{key_capacity} per sequence (max_pages * page_size)")
        elif offsets[-1] != tokens:
            raise ValueError(f"{name} must end at the number of tokens ({tokens}), got {offsets[-1]}")
        if max(lengths) > max_len:
            raise ValueError(f"{max_name}={max_len} is smaller than the longest sequence in {name} ({max(lengths)})")
    return unit_stride(cu_seqlens_q), unit_stride(cu_seqlens_k), max_seqlen_q, max_seqlen_k


# Values read back from device tensors, kept while the tensor is unchanged (see _read_back_key): a tensor read as
# values (cu_seqlens, cache_leftpad, cache_batch_idx) -> (key, values); block table -> (key, its largest entry).
_VALUES = WeakIdKeyDictionary()
_TABLE_MAX = WeakIdKeyDictionary()


def _read_back_key(t):
    """(version, data pointer, shape, strides) of t: what a cached read-back of t is valid for. Writes through torch
    ops move the version counter; writes that bypass it are not seen (through `t.data`, numpy / DLPack views, a
    custom kernel, a CUDA graph's replay, an in-place torch.distributed collective): build a new tensor for new
    values. None for an inference tensor (made under torch.inference_mode: no version counter), whose values are read
    back on every call."""
    return None if t.is_inference() else (t._version, t.data_ptr(), t.shape, t.stride())


def read_back(t):
    """t's values as a list. Read back (one device sync) the first time a tensor is seen and after it changes
    through torch; then from _VALUES, so the layers of a model that share one cu_seqlens (or one cache_leftpad)
    pay one sync per batch, not one per call (the sync measured ~0.3 ms per call on the H200 machine's host)."""
    key = _read_back_key(t)
    hit = _VALUES.get(t) if key is not None else None
    if hit is not None and hit[0] == key:
        return hit[1]
    values = t.tolist()
    if key is not None:
        _VALUES[t] = (key, values)
    return values


def unit_stride(t):
    """t, or a contiguous copy where its last dim is strided: the kernels index per-row tensors (cache_seqlens,
    cache_leftpad, cu_seqlens, block-table rows) as ptr + i. A copy is one small kernel (also under a CUDA graph's
    capture, where it reads the view at each replay); a row-strided slice of a wider block table stays as it is."""
    return t if t.numel() <= 1 or t.stride(-1) == 1 else t.contiguous()


def capturing(t):
    """True while a CUDA graph is being captured on t's device: values in device tensors cannot be read back
    then (no sync), so checks of tensor contents are skipped; shapes, dtypes and devices are still checked."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def block_table(table, batch, device):
    """The shape, dtype and device of an int32 (batch, max_pages) page table (batch None: any rows). Returns the table
    as the kernels read it (unit_stride). Its entries: block_table_pages, once the keys each row reads are known."""
    if not isinstance(table, torch.Tensor) or table.dtype != torch.int32 or table.dim() != 2:
        raise TypeError(f"block_table must be an int32 tensor of shape ({batch or 'batch'}, max_pages), got "
                        f"{getattr(table, 'dtype', type(table).__name__)} {tuple(getattr(table, 'shape', ()))}")
    if batch is not None and table.shape[0] != batch:
        raise ValueError(f"block_table must have {batch} rows (the batch), got {table.shape[0]}")
    if table.device != device:
        raise ValueError(f"block_table is on {table.device} but the cache is on {device}")
    return unit_stride(table)


def block_table_pages(table, num_pages, page_size, keys):
    """The entries of table that the call reads index one of num_pages pages: row b's first ceil(keys[b] / page_size)
    (keys: one count per row, or an int for every row; at most the table's capacity). As flash-attn, the entries past
    them are never read, so a table padded there (with -1, say) is fine. Skipped while capturing / tracing."""
    if not table.numel() or capturing(table) or torch.compiler.is_compiling():
        return
    if not isinstance(keys, int) and min(keys) == max(keys):  # one count for every row: a slice of the table
        keys = keys[0]
    pages = -(-keys // page_size) if isinstance(keys, int) else tuple(-(-n // page_size) for n in keys)
    _check_pages(table, num_pages, pages)


def _covered(pages, checked):
    """Rows' page counts `pages` lie within those checked (each an int for every row, or a tuple per row)."""
    if isinstance(pages, int) and isinstance(checked, int):  # the common decode step's: no loop over the rows
        return pages <= checked
    rows = len(pages) if isinstance(pages, tuple) else len(checked)
    pages, checked = ((n,) * rows if isinstance(n, int) else n for n in (pages, checked))
    return all(now <= then for now, then in zip(pages, checked))


def _check_pages(table, num_pages, pages):
    """The first pages[b] entries of row b (pages an int: of every row) index one of num_pages pages. The bounds take
    one device sync; a table that passed and has not changed since (_read_back_key) is not read again while its rows
    use no more pages, so the layers of a decode step that share one table pay one sync per step (session 36: an eager
    B8 paged step 0.19 ms, contiguous 0.07 ms)."""
    key = _read_back_key(table)
    hit = _TABLE_MAX.get(table) if key is not None else None
    if hit is not None and hit[0] == key and hit[1] < num_pages and _covered(pages, hit[2]):
        return
    entries = table
    if isinstance(pages, int):
        entries = table[:, :pages]  # a view: no copy
    elif min(pages) < table.shape[1]:  # 0 stands in for the entries no key reads (a valid page of any cache)
        in_use = torch.arange(table.shape[1], device=table.device) < torch.tensor(pages, device=table.device)[:, None]
        entries = table.where(in_use, 0)
    if not entries.numel():
        return
    low, high = torch.stack(torch.aminmax(entries)).tolist()  # one device sync for both bounds
    if low < 0 or high >= num_pages:
        raise ValueError(f"block_table entries must index the cache's {num_pages} pages, got values in "
                         f"[{low}, {high}] (in the pages the keys lie in)")
    if key is not None:
        _TABLE_MAX[table] = (key, high, pages)


def _finite(x):
    """math.isfinite(x) in comparisons: torch.compile(dynamic=True) traces a float argument as a symbolic float,
    which math.isfinite cannot take (a graph break, an error under fullgraph=True); False for NaN too."""
    return -math.inf < x < math.inf


def softmax_scale_or_default(softmax_scale, head_dim):
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if not _is_real(softmax_scale):
        raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
    if not _finite(softmax_scale):
        raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    return float(softmax_scale)


# A window side at least this wide reaches past any sequence (lengths and offsets are int32), so it is unbounded:
# taken as -1, which also keeps the kernels' int arguments in range (a 64-bit side overflowed them).
_UNBOUNDED_WINDOW = 2**31 - 1


def window(window_size, causal):
    """(left, right) with -1 for unbounded (also any side >= 2^31 - 1); causal forces right = 0, as flash-attn
    does."""
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ValueError(f"window_size must be a pair (left, right), got {window_size!r}") from None
    for name, side in (("left", left), ("right", right)):
        if not _is_int(side) or side < -1:
            raise ValueError(f"window_size {name} must be an integer >= -1 (-1 = unbounded), got {side!r}")
    left, right = (-1 if side >= _UNBOUNDED_WINDOW else int(side) for side in (left, right))
    return left, 0 if causal else right


def softcap_value(softcap):
    if not _is_real(softcap):
        raise TypeError(f"softcap must be a float, got {type(softcap).__name__}")
    if not _finite(softcap) or softcap < 0:
        raise ValueError(f"softcap must be finite and >= 0 (0 = off), got {softcap}")
    return float(softcap)


def _optional_tensor(name, t, q, dtypes, expected):
    """Common checks of an optional tensor argument: a tensor, of one of dtypes, on q's device."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} has dtype {t.dtype}; expected {expected}")
    if t.device != q.device:
        raise ValueError(f"{name} is on {t.device} but q is on {q.device}")


def alibi(alibi_slopes, q, batch, heads):
    """None, or fp32 slopes of shape (nheads,) or (batch, nheads) on q's device, contiguous."""
    if alibi_slopes is None:
        return None
    _optional_tensor("alibi_slopes", alibi_slopes, q, (torch.float32,), "torch.float32")
    if tuple(alibi_slopes.shape) not in ((heads,), (batch, heads)):
        raise ValueError(f"alibi_slopes must have shape ({heads},) or ({batch}, {heads}) (nheads of q), "
                         f"got {tuple(alibi_slopes.shape)}")
    return alibi_slopes.contiguous()


def sink_logits(sink, q, heads):
    """None, or the (nheads,) sink logits as fp32 on q's device (autograd casts the gradient back)."""
    if sink is None:
        return None
    _optional_tensor("sink", sink, q, SUPPORTED_DTYPES, "torch.float16, torch.bfloat16 or torch.float32")
    if tuple(sink.shape) != (heads,):
        raise ValueError(f"sink must have shape ({heads},) (nheads of q), got {tuple(sink.shape)}")
    return sink.float().contiguous()


def attn_bias(bias, q, target, varlen=False):
    """None, or the additive bias as a 4-D view broadcastable to target: (batch, nheads, seqlen_q, seqlen_k),
    or with varlen (batch, nheads, max_seqlen_q, max_seqlen_k) indexed by positions within each sequence."""
    if bias is None:
        return None
    _optional_tensor("attn_bias", bias, q, SUPPORTED_DTYPES, "torch.float16, torch.bfloat16 or torch.float32")
    layout = "(batch, nheads, max_seqlen_q, max_seqlen_k)" if varlen else "(batch, nheads, seqlen_q, seqlen_k)"
    if bias.dim() > 4:
        raise ValueError(f"attn_bias must have at most 4 dimensions, broadcastable to {target} "
                         f"{layout}, got shape {tuple(bias.shape)}")
    bias4 = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
    if any(size not in (1, want) for size, want in zip(bias4.shape, target)):
        raise ValueError(f"attn_bias of shape {tuple(bias.shape)} does not broadcast to {target} {layout}")
    return bias4


def dropout_p(p):
    """dropout_p as a float in [0, 1)."""
    if not _is_real(p):
        raise TypeError(f"dropout_p must be a float, got {type(p).__name__}")
    if not 0.0 <= p < 1.0:  # also rejects NaN
        raise ValueError(f"dropout_p must be in [0, 1), got {p}")
    return float(p)


def flag(name, value):
    """A bool argument (causal, deterministic, return_attn_probs, ...) as given; anything else (a 0/1 int, None, a
    string, a numpy bool, a tensor) is a TypeError, named with its module where it has one (numpy.bool and bool
    would read alike)."""
    if not isinstance(value, bool):
        kind = type(value)
        name_of = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        raise TypeError(f"{name} must be a bool, got {name_of}")
    return value
