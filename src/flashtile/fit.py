"""Launches that fit the GPU's shared memory.

configs.py's tables are sized for the A100 / H100 class (164-227 KB of shared memory per block). GPUs with less
(sm86 / sm89 / sm120: 99 KB, sm75: 64 KB) refuse some of those tiles: triton raises OutOfResources when it loads the
kernel, before anything runs. launch() then runs the same kernel with one pipeline stage, then with its tiles
halved, the largest first, down to 16: the loop tile (KernelLaunch.shrink: a constexpr the kernel steps through, on
which no argument and no grid axis depends) and the grid tile (KernelLaunch.grid_tile: (constexpr, grid axis, extent),
the axis then recomputed as cdiv(extent, tile)). It remembers per launch signature what loaded, so later calls go
straight there. GPUs the tables fit never pay more than one truth test per launch.
"""
import torch
from triton.runtime.errors import OutOfResources

from . import fast_launch

MIN_TILE = 16  # tl.dot's smallest operand dimension
_fits = {}  # launch signature -> the keyword arguments that loaded in place of the refused ones


def launch(kl):
    """Runs KernelLaunch kl (kernel[grid](*args, **constexprs, num_warps, num_stages)), with smaller tiles where
    the GPU refuses kl's for their shared memory."""
    kwargs = {**kl.constexprs, "num_warps": kl.num_warps, "num_stages": kl.num_stages}
    if _fits:  # some launch was refused in this process: this one may have been
        signature = _signature(kl)
        fitted = _fits.get(signature)
        if fitted is not None:
            try:
                fast_launch.launch(kl.kernel, grid_for(kl, fitted), kl.args, fitted)
                return
            except OutOfResources:  # not expected (the signature holds what sizes the tiles): search again
                del _fits[signature]
    try:
        fast_launch.launch(kl.kernel, kl.grid, kl.args, kwargs)
    except OutOfResources as refused:
        if "shared" not in str(refused):
            raise
        tried = []
        for smaller in smaller_variants(kwargs, tiles(kl)):
            try:
                fast_launch.launch(kl.kernel, grid_for(kl, smaller), kl.args, smaller)
            except OutOfResources:
                tried.append({name: smaller[name] for name in ("num_stages", *tiles(kl))})
                continue
            signature = _signature(kl)
            if signature is not None:
                _fits[signature] = smaller
            return
        if hasattr(refused, "add_note"):  # Python 3.11+
            refused.add_note(f"flashtile (fit.py) also tried, each refused: {tried or 'nothing smaller'}")
        raise


def tiles(kl):
    """The constexpr names of kl's tiles that fit.py may halve: its loop tile, then its grid tile."""
    return (*kl.shrink, *kl.grid_tile[:1])


def grid_for(kl, kwargs):
    """kl's grid for the tiles in kwargs: the grid tile's axis recomputed, the rest as kl has it."""
    if not kl.grid_tile:
        return kl.grid
    name, axis, extent = kl.grid_tile
    grid = list(kl.grid)
    grid[axis] = -(-extent // kwargs[name])
    return tuple(grid)


def smaller_variants(kwargs, names):
    """Ever smaller variants of a launch's keyword arguments: one pipeline stage, then the largest of the tiles
    named in names halved (the first of equals), one at a time, none below MIN_TILE."""
    kwargs = dict(kwargs)
    if kwargs["num_stages"] > 1:
        kwargs["num_stages"] = 1
        yield dict(kwargs)
    while True:
        larger = [name for name in names if kwargs[name] > MIN_TILE]
        if not larger:
            return
        name = max(larger, key=lambda n: kwargs[n])  # max keeps the first of equals
        kwargs[name] //= 2
        yield dict(kwargs)


def _signature(kl):
    """What sizes a launch's shared memory: the kernel, its constexprs and options, its tensors' dtypes (fp16 and fp32
    launches can share every constexpr) and the device; None where a constexpr is unhashable (nothing is
    remembered then)."""
    tensors = [a for a in kl.args if isinstance(a, torch.Tensor)]
    signature = (kl.kernel, tuple(kl.constexprs.items()), kl.num_warps, kl.num_stages,
                 tuple(t.dtype for t in tensors), tensors[0].device if tensors else None)
    try:
        hash(signature)
    except TypeError:
        return None
    return signature
