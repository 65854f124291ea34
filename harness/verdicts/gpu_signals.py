"""The process-wide lines of a llama-server log that say why a GPU backend was not used
(pure): a backend's failed init, Vulkan's empty device list, the ``-ngl`` handler's
warning, and the backends ``system_info`` lists. ``harness.verdicts.gpu_use`` weighs them
per block.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass


class GpuBackend(enum.StrEnum):
    """GPU backends by the prefix ggml gives their devices and buffers (``CUDA0``, ``ROCm0``).

    From the pinned source: GGML_CUDA_NAME (ggml/include/ggml-cuda.h: ``CUDA``, or ``ROCm``
    under HIP), GGML_VK_NAME (ggml-vulkan.h), GGML_SYCL_NAME (ggml-sycl.h) and
    GGML_METAL_NAME (ggml-metal.cpp: ``MTL``).
    """

    CUDA = "CUDA"
    ROCM = "ROCm"
    VULKAN = "Vulkan"
    SYCL = "SYCL"
    METAL = "MTL"


_INIT_FAILED = re.compile(
    r"ggml_cuda_init: failed to initialize (?P<backend>CUDA|ROCm|MUSA): (?P<error>.*?)\s*$")
_VK_NO_DEVICES = re.compile(r"ggml_vulkan: No devices found")
_NO_USABLE_GPU = re.compile(
    r"warning: no usable GPU found, --gpu-layers(?P<draft>-draft)? option will be ignored")
_BACKEND_NAMES = frozenset(b.value for b in GpuBackend)
#: src/llama.cpp ``llama_print_system_info``: ``<backend> : <feature> = <value> | …`` per
#: registered backend that has features, logged by common as ``system_info: …``.
_SYSTEM_INFO = re.compile(r"system_info: (?P<features>.*)$")
#: Feature entries read ``NAME = value``; only a backend name is followed by `` : ``.
_FEATURE_SECTION = re.compile(r"\b([A-Za-z]+) : ")
_FEATURED = frozenset({GpuBackend.CUDA, GpuBackend.ROCM})


@dataclass(frozen=True)
class Signals:
    init_failed: dict[GpuBackend, str]
    vulkan_no_devices: bool
    no_usable_gpu: bool
    no_usable_gpu_draft: bool
    #: Backends ``system_info`` lists features for (None: no system_info line). CUDA and
    #: ROCm register features (ggml-cuda.cu ``ggml_backend_get_features``); Vulkan does not.
    featured_backends: frozenset[str] | None = None

    def lacks(self, backend: GpuBackend) -> bool:
        """The build's own system_info shows it was built without ``backend``."""
        return (backend in _FEATURED and self.featured_backends is not None
                and backend.value not in self.featured_backends)


def read_signals(texts: Iterable[str]) -> Signals:
    init_failed: dict[GpuBackend, str] = {}
    no_devices = no_gpu = no_gpu_draft = False
    featured: frozenset[str] | None = None
    for text in texts:
        if featured is None and (info := _SYSTEM_INFO.search(text)):
            featured = frozenset(_FEATURE_SECTION.findall(info["features"]))
        found = _INIT_FAILED.search(text)
        if found and found["backend"] in _BACKEND_NAMES:
            init_failed[GpuBackend(found["backend"])] = found["error"]
        no_devices = no_devices or _VK_NO_DEVICES.search(text) is not None
        if found := _NO_USABLE_GPU.search(text):
            no_gpu_draft = no_gpu_draft or found["draft"] is not None
            no_gpu = no_gpu or found["draft"] is None
    return Signals(init_failed, no_devices, no_gpu, no_gpu_draft, featured)
