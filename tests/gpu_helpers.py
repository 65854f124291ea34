"""What the GPU-facing tests need to know about this machine (``import gpu_helpers``)."""

from __future__ import annotations

import pynvml


def nvml_answers() -> bool:
    """Whether NVML initialises here, i.e. an NVIDIA driver is loaded."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True
