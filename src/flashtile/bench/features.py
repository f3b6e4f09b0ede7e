"""Feature settings of the benchmark (``--feature SPEC``): sliding window, softcap, ALiBi, dropout,
attention sinks and an additive bias.

SPEC is ``none`` or parts joined with ``+``: ``window:L:R`` (-1 = unbounded side), ``softcap:X`` (X > 0),
``alibi`` (the standard geometric slopes for the query heads), ``dropout:P`` (0 < P < 1), ``sink`` (one
learnable logit per query head, its gradient computed in the backward), ``bias`` (a fixed additive bias of
shape (1, Hq, Sq, Sk) in the inputs' dtype, broadcast over the batch; no gradient). Example:
``window:512:0+softcap:30``. Outputs with dropout are random and are not compared with the reference.
"""
import math
from dataclasses import dataclass

import torch

NONE = "none"


@dataclass(frozen=True)
class Feature:
    """One parsed setting; ``spec`` is its canonical text (what records store)."""

    spec: str = NONE
    window_size: tuple = (-1, -1)
    softcap: float = 0.0
    alibi: bool = False
    dropout: float = 0.0
    sink: bool = False
    bias: bool = False

    @property
    def windowed(self):
        return self.window_size != (-1, -1)

    @property
    def window_only(self):
        return self.parts() == ["window"]

    def kwargs(self, heads_q, device, seqlen_q=None, seqlen_k=None, dtype=None, rows=None):
        """flash_attn_func keyword arguments for this setting (only the ones that differ from the default).
        The bias needs the sequence lengths and dtype; ``rows`` keeps only its last query rows (the
        accuracy check's slice)."""
        out = {}
        if self.windowed:
            out["window_size"] = self.window_size
        if self.softcap:
            out["softcap"] = self.softcap
        if self.alibi:
            out["alibi_slopes"] = alibi_slopes(heads_q, device)
        if self.dropout:
            out["dropout_p"] = self.dropout
        if self.sink:
            out["sink"] = torch.linspace(-1.0, 1.0, heads_q, device=device).requires_grad_()
        if self.bias:
            out["attn_bias"] = bias(heads_q, seqlen_q, seqlen_k, dtype, device, rows)
        return out

    def parts(self):
        """Names of the active parts, e.g. ["window", "softcap"]."""
        return [name for name, on in (("window", self.windowed), ("softcap", self.softcap), ("alibi", self.alibi),
                                      ("dropout", self.dropout), ("sink", self.sink), ("bias", self.bias)) if on]


def _int(text, what):
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{what} must be an integer, got {text!r}") from None
    if value < -1:
        raise ValueError(f"{what} must be >= -1 (-1 = unbounded), got {value}")
    return value


def parse(spec):
    """``'window:512:0+softcap:30'`` -> Feature; raises ValueError with a readable message."""
    text = spec.strip().lower()
    if text == NONE:
        return Feature()
    window, softcap, alibi, dropout, flags, canon = (-1, -1), 0.0, False, 0.0, set(), []
    for part in text.split("+"):
        name, *args = part.strip().split(":")
        if name == NONE:
            raise ValueError("'none' cannot be combined with other features")
        if name in [c.split(":")[0] for c in canon]:
            raise ValueError(f"{name!r} appears twice")
        if name == "window":
            if len(args) != 2:
                raise ValueError(f"window takes two values, window:LEFT:RIGHT, got {part.strip()!r}")
            window = (_int(args[0], "window LEFT"), _int(args[1], "window RIGHT"))
            if window == (-1, -1):
                raise ValueError("window:-1:-1 is no window; use 'none'")
            canon.append(f"window:{window[0]}:{window[1]}")
        elif name == "softcap":
            try:
                softcap = float(args[0]) if len(args) == 1 else math.nan
            except ValueError:
                softcap = math.nan
            if not (softcap > 0 and math.isfinite(softcap)):
                raise ValueError(f"softcap takes one finite number > 0, softcap:X, got {part.strip()!r}")
            canon.append(f"softcap:{softcap:g}")
        elif name == "alibi":
            if args:
                raise ValueError(f"alibi takes no values, got {part.strip()!r}")
            alibi = True
            canon.append("alibi")
        elif name == "dropout":
            try:
                dropout = float(args[0]) if len(args) == 1 else math.nan
            except ValueError:
                dropout = math.nan
            if not 0 < dropout < 1:
                raise ValueError(f"dropout takes one probability 0 < P < 1, dropout:P, got {part.strip()!r}")
            canon.append(f"dropout:{dropout:g}")
        elif name in ("sink", "bias"):
            if args:
                raise ValueError(f"{name} takes no values, got {part.strip()!r}")
            flags.add(name)
            canon.append(name)
        else:
            raise ValueError(f"unknown feature {name!r} (choose from none, window:L:R, softcap:X, alibi, "
                             f"dropout:P, sink, bias)")
    return Feature("+".join(canon), window, softcap, alibi, dropout, "sink" in flags, "bias" in flags)


def bias(heads, seqlen_q, seqlen_k, dtype, device, rows=None):
    """The benchmark's additive bias (1, heads, Sq, Sk): a smooth deterministic pattern of magnitude <= 1,
    so a slice of it (the last ``rows`` queries) can be rebuilt for the accuracy check."""
    first = seqlen_q - (rows or seqlen_q)
    i = torch.arange(first, seqlen_q, device=device, dtype=torch.float32).view(1, 1, -1, 1)
    j = torch.arange(seqlen_k, device=device, dtype=torch.float32).view(1, 1, 1, -1)
    h = torch.arange(heads, device=device, dtype=torch.float32).view(1, -1, 1, 1)
    return torch.sin(0.013 * i + 0.007 * j + h).to(dtype)


def _geometric(n):
    start = 2.0 ** (-8.0 / n)
    return [start ** (i + 1) for i in range(n)]


def alibi_slopes(heads, device="cpu"):
    """ALiBi slopes (Press et al.) for ``heads`` heads: fp32 (heads,) on ``device``.

    Powers of two get 2^(-8/n)^(1..n); other counts take the nearest lower power's slopes plus every
    other slope of the next power, as in the paper's reference code.
    """
    low = 2 ** int(math.floor(math.log2(heads)))
    slopes = _geometric(low)
    if low < heads:
        slopes += _geometric(2 * low)[0::2][: heads - low]
    return torch.tensor(slopes, dtype=torch.float32, device=device)
