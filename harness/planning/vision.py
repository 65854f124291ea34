"""A launch's vision projector: where it goes and what it costs (pure).

The runtime in docs/references.md (reference 002) budgets a multimodal projector into its
resident estimate and its GPU share (``additionalGpuBytes``: the vision budget plus the
drafter's). llama-server loads one with ``--mmproj`` and puts it on the first GPU unless
``--no-mmproj-offload`` keeps it on the CPU (tools/server's ``mmproj_use_gpu``); the
loader reports both (tools/mtmd/clip.cpp: ``CLIP using <backend> backend`` and
``model size``/``metadata size``), which is how a launch is verified
(``harness.verdicts.plan_check``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class VisionPlan:
    """The projector a launch loads, its bytes, and whether they are planned on the GPU."""

    projector: Path
    projector_bytes: int
    on_gpu: bool
    reason: str

    @property
    def gpu_bytes(self) -> int:
        """What the projector adds to the GPU share."""
        return self.projector_bytes if self.on_gpu else 0


def plan_vision(projector: Path | None, projector_bytes: int, *, gpu_planned: bool,
                keep_off_gpu: bool) -> VisionPlan | None:
    """The plan for ``projector`` (None: no vision route) of ``projector_bytes`` (its
    file), on a launch that plans a GPU or not, with ``--no-mmproj-offload`` or not."""
    if projector is None:
        return None
    size = f"{projector_bytes / (1 << 20):.2f} MiB"
    if not gpu_planned:
        where, on_gpu = "on the host (no GPU planned)", False
    elif keep_off_gpu:
        where, on_gpu = "on the host (--no-mmproj-offload)", False
    else:
        where, on_gpu = "on the GPU, beside the weights (llama-server's default)", True
    return VisionPlan(projector, projector_bytes, on_gpu,
                      f"vision projector {projector.name}: {size} {where}")


def vision_fields(vision: VisionPlan | None, keep_off_gpu: bool) -> dict[str, object]:
    """The ``LaunchSpec`` fields that send the projector (none without one)."""
    if vision is None:
        return {}
    fields: dict[str, object] = {"mmproj": vision.projector}
    if keep_off_gpu:
        fields["no_mmproj_offload"] = True
    return fields
