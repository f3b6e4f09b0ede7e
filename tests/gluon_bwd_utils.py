"""Inputs and checks shared by the Hopper Gluon backward's test files (test_gluon_bwd_*.py): the sm90 gate, ALiBi
slopes of a case, and the sink gradient as the preprocess adds it up."""
import torch


ON_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _alibi(kind, batch, heads):
    if kind is None:
        return None
    shape = (heads, ) if kind == "h" else (batch, heads)
    return (torch.rand(shape, generator=torch.Generator().manual_seed(2)) * 0.1).cuda()


def _sink_grad_from_rows(out, dout, lse, sink):
    """The sink gradient as the preprocess adds it up, in float64: -sum over batches and rows of exp(sink - lse) *
    rowsum(out * dout); out / dout (B, S, H, D), lse (B, H, S)."""
    rowsum = (out.double() * dout.double()).sum(-1).transpose(1, 2)  # (B, H, S)
    return -(torch.exp(sink.double()[None, :, None] - lse.double()) * rowsum).sum((0, 2))
