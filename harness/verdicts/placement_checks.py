"""The ``compare_launch`` checks of where a launch put its weights and its KV cache (pure).

Each check takes a planned value and the ``LaunchReport`` and returns a
``field_check.FieldCheck``, applying the request the way llama.cpp does: ``-ngl`` clamped
to the offloadable layers, ``--n-cpu-moe`` / ``--n-cpu-ffn`` / ``--cpu-moe`` read from the
``buffer type overridden`` lines, the load mode from the buffers it left, the KV cache's
device from the offloaded layers, and ``--split-mode`` / ``--main-gpu`` from the devices
the model was given. ``PLACEMENT_COMPARERS`` names them by ``LaunchSpec`` field for
``plan_check``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

from harness.facts.gpu import LoadMode, SplitMode
from harness.verdicts.block_report import GPU_DEVICE_NAME
from harness.verdicts.field_check import Comparer, FieldCheck, int_field
from harness.verdicts.launch_report import LaunchReport

#: LLM_FFN_EXPS_REGEX / LLM_FFN_DENSE_REGEX of common/common.h: what --n-cpu-moe and
#: --n-cpu-ffn move to the CPU, block by block.
_EXPERT_TENSOR = re.compile(r"\.ffn_(up|down|gate|gate_up)_(ch|)exps")
_DENSE_FFN_TENSOR = re.compile(r"\.ffn_(up|down|gate)\.")
_NO_GPU_LINE = "no 'offloaded N/M layers to GPU' line (a build without GPU)"


def _n_gpu_layers(value: object, report: LaunchReport) -> FieldCheck:
    ngl = int_field(value, "n_gpu_layers")
    offloaded = report.target.offloaded_layers if report.target else None
    if offloaded is None:
        return FieldCheck(ngl, None, _NO_GPU_LINE)
    want = min(ngl, offloaded[1]) if ngl >= 0 else offloaded[1]
    return FieldCheck(want, offloaded[0], f"of {offloaded[1]} offloadable")


def _override_blocks(report: LaunchReport, tensor: re.Pattern[str]) -> tuple[int, ...] | None:
    if not report.overrides:
        return None
    return tuple(sorted({o.block for o in report.overrides
                         if o.block is not None and tensor.search(o.tensor)}))


def _first_blocks(key: str, tensor: re.Pattern[str]) -> Comparer:
    def check(value: object, report: LaunchReport) -> FieldCheck:
        n = int_field(value, key)
        blocks = _override_blocks(report, tensor)
        if blocks is None:
            return FieldCheck(n, None, "no 'buffer type overridden' lines (they need -lv 5)")
        # Blocks without such tensors (a dense leading block) are not overridden, so the
        # check is that every overridden block is one of the first n, and some are.
        return FieldCheck(n, blocks, f"the first {n} blocks' tensors go to the CPU",
                          ok=bool(blocks) and max(blocks) < n)
    return check


def _cpu_moe(value: object, report: LaunchReport) -> FieldCheck:
    if value is False:
        # LaunchSpec's default: the switch is simply not passed.
        return FieldCheck(False, False)
    blocks = _override_blocks(report, _EXPERT_TENSOR)
    return FieldCheck(bool(value), bool(blocks) if blocks is not None else None)


#: The load modes that lock the weights in RAM (src/llama-model.cpp ``load_tensors``:
#: ``use_mlock``); whether the file was mapped is read from the buffers instead.
_MLOCK_MODES = frozenset({LoadMode.MLOCK, LoadMode.MMAP_MLOCK})


def _effective_load_mode(report: LaunchReport) -> LoadMode | None:
    """The mode the weights were loaded with, from what the load did rather than its echo:
    mmap is a ``*_Mapped`` model buffer, mlock a lock mode with no mlock failure."""
    printed, mapped = report.load_mode, report.weights_mapped
    if printed is None or mapped is None:
        return None
    locked = printed in _MLOCK_MODES and not report.mlock_failures
    if mapped:
        return LoadMode.MMAP_MLOCK if locked else LoadMode.MMAP
    if locked:
        return LoadMode.MLOCK
    # Direct I/O leaves no trace of its own beyond the echo; without mmap it reads like none.
    return LoadMode.DIO if printed is LoadMode.DIO else LoadMode.NONE


def _load_mode(value: object, report: LaunchReport) -> FieldCheck:
    planned = LoadMode(str(getattr(value, "value", value)))
    observed = _effective_load_mode(report)
    if observed is None:
        return FieldCheck(planned.value, None,
                          "no 'load_tensors: … (load_mode = …)' or model buffer line")
    printed = report.load_mode
    mapped = "in a mapped buffer" if report.weights_mapped else "in an unmapped buffer"
    detail = f"load_tensors printed load_mode = {printed}, weights {mapped}"
    if report.mlock_failures:
        detail += f"; {report.mlock_failures[0]}"
    want = planned
    if planned is LoadMode.AUTO:
        # auto: mmap unless a device cannot map; load_tensors prints what it resolved to.
        want = LoadMode.MMAP if printed is LoadMode.MMAP else LoadMode.NONE
    return FieldCheck(want.value, observed.value, detail,
                      ok=observed is want and printed in (want, planned))


def _kv_offload(value: object, report: LaunchReport) -> FieldCheck:
    planned = bool(value)
    offloaded = report.target.offloaded_layers if report.target else None
    if offloaded is None:
        return FieldCheck(planned, None, _NO_GPU_LINE)
    # llama_kv_cache puts a layer's cache on that layer's device (model.dev_layer) when
    # offload is on, else on the CPU; of N offloaded layers one is the output layer
    # (load_tensors "offloading output layer to GPU"), so repeating layers are on the GPU
    # only when N > 1.
    repeating_on_gpu = offloaded[0] > 1
    want = planned and repeating_on_gpu
    detail = ("" if want == planned
              else f"{offloaded[0]}/{offloaded[1]} offloaded: no repeating layer, so no KV, is "
                   "on the GPU")
    return FieldCheck(want, report.kv_on_gpu, detail)


def _observed_split_mode(report: LaunchReport) -> tuple[frozenset[SplitMode], str] | None:
    """The split modes the device lines allow, and why; None when no GPU device is named."""
    target = report.target
    if target is not None and target.tensor_split_devices is not None:
        return frozenset({SplitMode.TENSOR}), (
            f"a Meta device over {target.tensor_split_devices} devices")
    # Row split puts matrices in the backend's split buffer type (make_gpu_buft_list). In
    # the pinned source only SYCL (``SYCL_Split``) has one; CUDA, ROCm and Vulkan refuse
    # the load ("does not support split buffers"), which fails the start instead.
    if target is not None and any(buf.buffer.endswith("_Split") for buf in target.model_buffers):
        return frozenset({SplitMode.ROW}), "a *_Split model buffer"
    gpus = report.gpu_devices
    if not gpus:
        return None
    if len(gpus) > 1:
        return frozenset({SplitMode.LAYER}), f"{len(gpus)} GPU devices: {', '.join(gpus)}"
    # One device: llama_prepare_model_devices keeps only the main GPU for none, and a
    # machine with one GPU gives layer the same single device.
    return frozenset({SplitMode.NONE, SplitMode.LAYER}), (
        f"one GPU device ({gpus[0]}): none and layer place the model alike")


def _split_mode(value: object, report: LaunchReport) -> FieldCheck:
    planned = SplitMode(str(getattr(value, "value", value)))
    seen = _observed_split_mode(report)
    if seen is None:
        return FieldCheck(planned.value, None, "no GPU 'using device' line (a build without GPU)")
    modes, why = seen
    observed = "|".join(sorted(m.value for m in modes))
    return FieldCheck(planned.value, observed, why, ok=planned in modes)


def _main_gpu(value: object, report: LaunchReport) -> FieldCheck:
    index = int_field(value, "main_gpu")
    gpus = report.gpu_devices
    if len(gpus) != 1:
        return FieldCheck(index, None, f"{len(gpus)} GPU 'using device' lines: --main-gpu "
                          "picks the one device only with --split-mode none")
    # llama_prepare_model_devices keeps devices[main_gpu] of the build's GPUs in registry
    # order, which ggml names <backend>0, <backend>1, … (one GPU backend, no RPC servers).
    found = GPU_DEVICE_NAME.match(gpus[0])
    observed = int(found["index"]) if found else None
    return FieldCheck(index, observed, f"the model's one device is {gpus[0]}")


PLACEMENT_COMPARERS: Mapping[str, Comparer] = MappingProxyType({
    "n_gpu_layers": _n_gpu_layers,
    "n_cpu_moe": _first_blocks("n_cpu_moe", _EXPERT_TENSOR),
    "n_cpu_ffn": _first_blocks("n_cpu_ffn", _DENSE_FFN_TENSOR),
    "cpu_moe": _cpu_moe,
    "load_mode": _load_mode,
    "kv_offload": _kv_offload,
    "split_mode": _split_mode,
    "main_gpu": _main_gpu,
})
