"""Random flash_attn_with_kvcache cases for tests/test_fuzz.py: a seed draws the cache layout (contiguous, a row
index into a larger cache, or paged with any page size in a shuffled page order), the rows' lengths and left
padding, an append with or without rotary (interleaved or GPT-NeoX, a rotary dim up to D), the query length
(decoding or a chunk), GQA, the split count and the score features (causal, window, softcap, ALiBi, scale). Checked:
the cache after the call (appended tokens where they belong, every other token untouched) and out / lse against the
float64 reference over each row's keys (DESIGN.md's rule; lse: fuzz_cases.assert_lse_rule)."""
import random
from dataclasses import dataclass

import torch

import flashtile
from fuzz_cases import assert_lse_rule, score_feature_parts, tanh_slack
from test_kvcache import rotate_reference
from utils import assert_close_rule


@dataclass(frozen=True)
class KVCase:
    seed: int
    batch: int
    seqlen_q: int
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: torch.dtype
    capacity: int  # tokens per row (paged: pages per row x page_size)
    lengths: tuple  # cache_seqlens before the call
    lengths_as_int: bool = False  # cache_seqlens passed as an int (all rows equal)
    lengths_none: bool = False  # cache_seqlens=None: every row uses the whole cache
    new: int = 0  # appended tokens per row
    page_size: int = 0  # 0: contiguous
    batch_idx: bool = False
    leftpad: tuple = ()
    rotary: tuple = ()  # () or (rotary_dim, interleaved)
    causal: bool = False
    window: tuple = (-1, -1)
    softcap: float = 0.0
    alibi: str = ""
    softmax_scale: float = None
    num_splits: int = 0

    def name(self):
        parts = [f"s{self.seed}", "kvcache", f"b{self.batch}", f"q{self.seqlen_q}",
                 "len" + ".".join(map(str, self.lengths)), f"cap{self.capacity}", f"h{self.heads_q}/{self.heads_kv}",
                 f"d{self.head_dim}", str(self.dtype).split(".")[-1]]
        parts += [n for n, on in (("int-len", self.lengths_as_int), ("no-len", self.lengths_none),
                                  ("batch-idx", self.batch_idx),
                                  ("causal", self.causal)) if on]
        if self.new:
            parts.append(f"append{self.new}")
        if self.page_size:
            parts.append(f"page{self.page_size}")
        if self.leftpad:
            parts.append("pad" + ".".join(map(str, self.leftpad)))
        if self.rotary:
            parts.append(f"rot{self.rotary[0]}{'-interleaved' if self.rotary[1] else '-neox'}")
        parts += score_feature_parts(self.window, self.softcap, self.alibi, self.softmax_scale)
        if self.num_splits:
            parts.append(f"splits{self.num_splits}")
        return "-".join(parts)


def draw(seed, gpu):
    rng = random.Random(seed)
    chance = rng.random
    if gpu:
        dtype = rng.choices([torch.bfloat16, torch.float16, torch.float32], [45, 45, 10])[0]
        head_dim = rng.choice([64, 128, 256]) if chance() < 0.7 else rng.choice([8, 40, 72, 96, 160, 192])
        batch, capacity = rng.randint(1, 8), rng.choice([rng.randint(16, 600), rng.randint(600, 8200)])
    else:
        dtype = rng.choice([torch.float16, torch.float32])
        head_dim = rng.choice([8, 16, 24, 32, 64])
        batch, capacity = rng.randint(1, 4), rng.randint(4, 90)
    heads_kv = rng.choice([1, 2, 3])
    heads_q = heads_kv * rng.choice([1, 2, 4, 8])
    seqlen_q = 1 if chance() < 0.6 else rng.randint(2, 8)
    page_size = 0
    if chance() < 0.5:
        page_size = rng.choice([16, 256, rng.randint(1, 64)]) if gpu else rng.randint(1, 16)
        capacity = -(-capacity // page_size) * page_size
    new = rng.randint(1, min(8, capacity)) if chance() < 0.5 else 0
    lengths_as_int = chance() < 0.3
    lengths = [rng.randint(0, capacity - new)] * batch if lengths_as_int else [
        rng.randint(0, capacity - new) for _ in range(batch)]
    lengths_none = not new and chance() < 0.1
    if lengths_none:
        lengths_as_int, lengths = False, [capacity] * batch
    features = {}
    if not page_size and chance() < 0.2:
        features["batch_idx"] = True
    if chance() < 0.2:
        features["leftpad"] = tuple(rng.randint(0, n) for n in lengths)
    if new and chance() < 0.4:
        features["rotary"] = (2 * rng.randint(1, head_dim // 2), chance() < 0.5)
    features["causal"] = chance() < 0.5
    if chance() < 0.2:
        side = lambda: rng.choice([-1, 0, rng.randint(1, capacity)])  # noqa: E731
        features["window"] = (side(), side())
    if chance() < 0.15:
        features["softcap"] = rng.choice([5.0, 30.0])
    if chance() < 0.2:
        features["alibi"] = rng.choice(["h", "bh"])
    if chance() < 0.2:
        features["softmax_scale"] = round(rng.uniform(0.05, 0.5), 4)
    if chance() < 0.4:
        features["num_splits"] = rng.choice([1, rng.randint(2, 8)])
    return KVCase(seed, batch, seqlen_q, heads_q, heads_kv, head_dim, dtype, capacity, tuple(lengths), lengths_as_int,
                  lengths_none, new, page_size, **features)


def check(case, device):
    gen = torch.Generator().manual_seed(case.seed)
    make = lambda *shape: torch.randn(*shape, generator=gen).to(device, case.dtype)  # noqa: E731
    batch, hk, d = case.batch, case.heads_kv, case.head_dim
    rows = batch + 2 if case.batch_idx else batch  # a larger cache whose rows the batch picks
    dense_k, dense_v = make(rows, case.capacity, hk, d), make(rows, case.capacity, hk, d)  # the logical caches
    q = make(batch, case.seqlen_q, case.heads_q, d)
    k_new, v_new = (make(batch, case.new, hk, d), make(batch, case.new, hk, d)) if case.new else (None, None)
    kwargs = dict(causal=case.causal, window_size=case.window, softcap=case.softcap,
                  softmax_scale=case.softmax_scale, num_splits=case.num_splits, return_softmax_lse=True)
    row_of = list(range(batch))
    if case.batch_idx:
        row_of = torch.randperm(rows, generator=gen)[:batch].tolist()
        kwargs["cache_batch_idx"] = torch.tensor(row_of, dtype=torch.int32, device=device)
    lengths = torch.tensor(case.lengths, dtype=torch.int32, device=device)
    kwargs["cache_seqlens"] = None if case.lengths_none else case.lengths[0] if case.lengths_as_int else lengths
    pad = list(case.leftpad) or [0] * batch
    if case.leftpad:
        kwargs["cache_leftpad"] = torch.tensor(pad, dtype=torch.int32, device=device)
    if case.alibi:
        kwargs["alibi_slopes"] = (torch.rand((batch, case.heads_q) if case.alibi == "bh" else (case.heads_q,),
                                             generator=gen) * 0.5).to(device)
    positions = lengths[:, None].long() + torch.arange(max(case.new, case.seqlen_q), device=device)  # [B, T]
    if case.rotary:
        rotary_dim, interleaved = case.rotary
        angles = torch.arange(case.capacity + 8)[:, None].float() * (0.7 ** torch.arange(rotary_dim // 2))[None, :]
        cos, sin = angles.cos().to(device), angles.sin().to(device)
        kwargs.update(rotary_cos=cos, rotary_sin=sin, rotary_interleaved=interleaved)
    if case.page_size:  # rows' pages in a shuffled order among a few unused ones
        per_row = case.capacity // case.page_size
        order = torch.randperm(batch * per_row + 3, generator=gen)[:batch * per_row]
        pages = order.reshape(batch, per_row).to(device)  # [B, pages per row]
        k_cache = make(batch * per_row + 3, case.page_size, hk, d)
        v_cache = make(batch * per_row + 3, case.page_size, hk, d)
        k_cache[pages] = dense_k.reshape(batch, per_row, case.page_size, hk, d)
        v_cache[pages] = dense_v.reshape(batch, per_row, case.page_size, hk, d)
        kwargs["block_table"] = pages.to(torch.int32)
    else:
        k_cache, v_cache = dense_k.clone(), dense_v.clone()
    before_k, before_v = k_cache.clone(), v_cache.clone()

    out, lse = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, **kwargs)

    # The cache: the logical rows after the call, against the rows before with the (rotated) new tokens written in.
    want_k, want_v = dense_k.clone(), dense_v.clone()
    k_written = k_new
    if case.rotary:  # drawn with an append only
        k_written = rotate_reference(k_new, cos, sin, positions[:, :case.new], interleaved)
    for b in range(batch):
        n = case.lengths[b]
        if case.new:
            want_k[row_of[b], n:n + case.new] = k_written[b]
            want_v[row_of[b], n:n + case.new] = v_new[b]
    if case.page_size:
        got_k = k_cache[pages].reshape(batch, case.capacity, hk, d)
        got_v = v_cache[pages].reshape(batch, case.capacity, hk, d)
        unused = torch.ones(k_cache.shape[0], dtype=torch.bool, device=device)
        unused[pages.flatten()] = False
        assert torch.equal(k_cache[unused], before_k[unused]) and torch.equal(v_cache[unused], before_v[unused])
    else:
        got_k, got_v = k_cache, v_cache
    torch.testing.assert_close(got_k, want_k)  # rotary: fp32 against complex float64, each rounded to the dtype
    assert torch.equal(got_v, want_v)

    # out and lse, row by row, over keys [leftpad, length + new) of the cache after the append.
    assert out.shape == q.shape and lse.shape == (batch, case.heads_q, case.seqlen_q)
    q_rot = q
    if case.rotary:
        at_start = not case.causal and case.window == (-1, -1)  # every query at the first new token's position
        q_pos = positions[:, :1].expand(-1, case.seqlen_q) if at_start else positions[:, :case.seqlen_q]
        q_rot = rotate_reference(q, cos, sin, q_pos, interleaved)
    slopes = kwargs.get("alibi_slopes")
    for b in range(batch):
        keys = slice(pad[b], case.lengths[b] + case.new)
        if keys.start == keys.stop:
            assert torch.all(out[b] == 0) and torch.all(lse[b] == float("-inf")), f"row {b}: no keys"
            continue
        # the cache as the call left it (checked against want_k above: rotary may differ from it by an ulp)
        args = [q_rot[b:b + 1], got_k[row_of[b]:row_of[b] + 1, keys], got_v[row_of[b]:row_of[b] + 1, keys]]
        features = dict(causal=case.causal, window_size=case.window, softcap=case.softcap,
                        softmax_scale=case.softmax_scale,
                        alibi_slopes=slopes[b] if slopes is not None and slopes.dim() == 2 else slopes)
        ref, ref_lse = flashtile.attention_ref(*args, return_lse=True, **features)
        low = flashtile.attention_ref(*args, upcast=False, **features)
        _, lse32 = flashtile.attention_ref(*(x.float() for x in args), upcast=False, return_lse=True, **features)
        assert_close_rule(f"row {b} out", out[b:b + 1], ref, low.nan_to_num(0.0), case.dtype)
        slack = tanh_slack(q, case.softcap) + (_rotated_q_slack(case, *args[:2]) if case.rotary else 0.0)
        assert_lse_rule(f"row {b} lse", lse[b:b + 1], ref_lse, lse32, slack)


def _rotated_q_slack(case, q_rot, keys):
    """How far lse may move because the kernel's rotated q (fp32 math, rounded to the dtype) and rotate_reference's
    (float64, rounded) can differ by an ulp per element: scale * max_j sum_d eps |q_d| |k_jd| bounds a score's move."""
    scale = case.softmax_scale if case.softmax_scale is not None else case.head_dim ** -0.5
    group = case.heads_q // case.heads_kv
    k_abs = keys.double().abs().repeat_interleave(group, dim=2)  # [1, Sk, Hq, D]
    moves = torch.einsum("bqhd,bkhd->bhqk", q_rot.double().abs() * torch.finfo(case.dtype).eps, k_abs)
    return scale * moves.max().item() if moves.numel() else 0.0
