"""The benchmark command: ``python -m flashtile.bench`` (see ``--help``).

Times flashtile against standard attention, PyTorch SDPA backends, FlexAttention and the flash-attn
packages; writes a table to stdout and results.json, results.csv and PNG plots to ``--out``.
"""
