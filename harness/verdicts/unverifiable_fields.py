"""Which planned launch fields a build's server cannot show, and why (pure).

``plan_check.compare_launch`` calls a field the log does not show a mismatch.
``unverifiable`` names the planned fields a build cannot show at all (a CPU build has no
GPU device to split over, select or put the KV cache on; a plan without a draft-*
implementation prints no draft sizes, one without checkpoints no spacing, and
``--main-gpu`` shows only with ``--split-mode none``), each with the reason, so a caller
leaves them out loudly (the Allure result and the run's summary, harness/plugin/unverified.py)
instead of passing them silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from harness.facts.build import Backend
from harness.facts.gpu import SplitMode

#: Planned fields a CPU build cannot show, and why. It registers no GPU device, so
#: llama_prepare_model_devices prints no ``using device`` line and load_tensors no
#: ``offloaded N/M layers to GPU`` line; every buffer is a CPU one.
CPU_UNVERIFIABLE: Mapping[str, str] = MappingProxyType({
    "n_gpu_layers": "a CPU build has no GPU to offload to: load_tensors prints no "
                    "'offloaded N/M layers to GPU' line",
    "split_mode": "a CPU build lists no GPU device (no 'using device' line from "
                  "llama_prepare_model_devices): there is nothing to split the model over",
    "main_gpu": "a CPU build lists no GPU device (no 'using device' line from "
                "llama_prepare_model_devices): there is no main GPU to pick",
    "kv_offload": "on a CPU build llama_kv_cache puts every layer's cache on the CPU with or "
                  "without --no-kv-offload: the 'KV buffer size' line says CPU either way",
})

#: Why a CPU build cannot show a projector planned on a GPU (one planned on the host, it
#: shows: ``CLIP using CPU backend``).
PROJECTOR_ON_CPU = ("a CPU build runs the projector on the CPU whatever the plan: "
                    "'CLIP using CPU backend'")

#: Why ``--spec-draft-sampling`` cannot be seen on any build of the pinned source.
SAMPLING_UNSHOWN = ("the draft sampling is printed nowhere: common/speculative.cpp's draft "
                    "line gives n_max, n_min, p_min and backend_sampling only, "
                    "and neither /props nor /slots carries it")

#: The speculative types whose implementations take and print the draft sizes
#: (common/speculative.cpp: the draft-* family; the ngram ones have sizes of their own).
_DRAFT_TYPE_PREFIX = "draft-"
_DRAFT_FIELDS = ("spec_draft_n_min", "spec_draft_n_max", "spec_draft_p_min")


def unverifiable(expected: Mapping[str, object], backend: Backend, *,
                 rpc_devices: bool = False) -> dict[str, str]:
    """The planned fields of ``expected`` (``compare_launch`` keys) that a ``backend`` build's
    server cannot show for this plan, each with the reason; ``compare_launch`` would call
    them mismatches. Unplanned (None) fields are not listed. ``rpc_devices``: the launch
    spreads the model over RPC devices (``--rpc``), which a CPU build with the RPC backend
    offloads to, names in ``using device`` lines and puts buffers on like GPUs.
    """
    planned = {key: value for key, value in expected.items() if value is not None}
    found: dict[str, str] = {}
    if backend is Backend.CPU and not rpc_devices:
        found.update({key: why for key, why in CPU_UNVERIFIABLE.items() if key in planned})
        if planned.get("projector_on_gpu") is True:
            found["projector_on_gpu"] = PROJECTOR_ON_CPU
    spec_types = str(planned.get("spec_type") or "none").split(",")
    if not any(t.startswith(_DRAFT_TYPE_PREFIX) for t in spec_types):
        why = (f"spec type {','.join(spec_types)} runs no draft-* implementation, so no "
               "'- n_max=…, n_min=…, p_min=…' line is printed and nothing uses the draft sizes")
        found.update({key: why for key in _DRAFT_FIELDS if key in planned})
    if "spec_draft_sampling" in planned:
        found["spec_draft_sampling"] = SAMPLING_UNSHOWN
    if planned.get("ctx_checkpoints") == 0 and "checkpoint_min_step" in planned:
        found["checkpoint_min_step"] = ("--ctx-checkpoints 0 disables checkpoints: load_model "
                                        "prints 'context checkpoints disabled', no spacing")
    split = str(getattr(planned.get("split_mode"), "value", planned.get("split_mode")))
    if "main_gpu" in planned and "main_gpu" not in found and split != SplitMode.NONE.value:
        found["main_gpu"] = (f"--split-mode {planned.get('split_mode') or 'layer (default)'}: "
                             "llama_prepare_model_devices applies --main-gpu only with "
                             "--split-mode none")
    return found
