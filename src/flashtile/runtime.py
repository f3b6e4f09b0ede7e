"""Which implementation a call on CPU tensors takes, decided without importing triton (the flash_attn_* API runs on
CPU tensors where triton is not installed: pip installs it on Linux only)."""
import os


def triton_missing(exc):
    """Whether a ModuleNotFoundError is triton's (or a submodule's) absence, not some other missing module."""
    return exc.name == "triton" or (exc.name or "").startswith("triton.")


def interpreter_active():
    """True when Triton kernels run through the interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
