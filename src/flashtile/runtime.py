"""Which implementation a call on CPU tensors takes, decided without importing triton (the flash_attn_* API runs on
CPU tensors where triton is not installed: pip installs it on Linux only)."""
import os


def interpreter_active():
    """True when Triton kernels run through the interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
