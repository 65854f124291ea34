"""The environment a ROCm build is launched and probed with (pure).

A ROCm build carries GPU code only for the gfx targets it was compiled for
(``-DGPU_TARGETS``). On a host with a GPU outside that list, HIP still enumerates the
card, ggml registers it, the planner counts its VRAM, and the first kernel launched on it
fails (``invalid device function``). The runtime in docs/references.md (reference 002,
``rocmLaunchEnv``) launches such a build with the cards it has no code for hidden, routes
the build's own rocBLAS kernel packs, and gives its device probe the same environment, so
the VRAM the planner reads is the VRAM the engine gets. This module decides that
environment from the build's targets and the devices ggml listed; the probe that lists
them and the runners that apply the result are I/O (``harness.probes.rocm_launch``).

Hiding uses ``ROCR_VISIBLE_DEVICES``: ROCr applies it before HIP enumerates, in the host's
numbering (ROCm's GPU-isolation docs recommend it on Linux), which leaves
``HIP_VISIBLE_DEVICES`` to the container runner's main-GPU selection over what ROCr left
(``harness.planning.container_gpu``). A variable the user already set is theirs: nothing
is planned over it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

#: ROCr's device filter (host numbering), applied before HIP's own.
VISIBILITY_VARIABLE = "ROCR_VISIBLE_DEVICES"
#: The variables a user may have set to choose devices themselves.
USER_VISIBILITY_VARIABLES: tuple[str, ...] = (VISIBILITY_VARIABLE, "HIP_VISIBLE_DEVICES",
                                              "CUDA_VISIBLE_DEVICES")
#: An index no device has: ROCr exposes no GPU, and ggml-cuda says
#: ``no ROCm-capable device is detected`` and the server runs on the CPU.
NONE_VISIBLE = "-1"
#: Where rocBLAS looks for its Tensile kernel packs (rocBLAS's documented override); set
#: when the build ships its own packs beside the binary.
KERNEL_PACKS_VARIABLE = "ROCBLAS_TENSILE_LIBPATH"
#: The CMake variables a ROCm build's targets are given in; the last one named wins.
_TARGET_FLAGS: tuple[str, ...] = ("GPU_TARGETS", "AMDGPU_TARGETS", "CMAKE_HIP_ARCHITECTURES")
#: ggml-cuda's ``ggml_cuda_init`` device line under HIP (ggml-cuda.cu:
#: ``"  Device %d: %s, %s (0x%x), VMM: %s, Wave Size: %d"``, the second ``%s`` being
#: ``gcnArchName`` such as ``gfx942:sramecc+:xnack-``).
_DEVICE_LINE = re.compile(
    r"\bDevice (?P<index>\d+): (?P<name>.+?), (?P<arch>gfx[0-9a-f]+(?:-[0-9a-z-]+)?)"
    r"(?P<features>(?::[a-z]+[+-])*) \(0x[0-9a-f]+\)")
#: LLVM's generic targets (AMDGPUUsage, "Generic Processor Versioning"): code built for
#: one runs on each processor listed.
GENERIC_TARGETS: Mapping[str, frozenset[str]] = MappingProxyType({
    "gfx9-generic": frozenset({"gfx900", "gfx902", "gfx904", "gfx906", "gfx909", "gfx90c"}),
    "gfx9-4-generic": frozenset({"gfx940", "gfx941", "gfx942", "gfx950"}),
    "gfx10-1-generic": frozenset({"gfx1010", "gfx1011", "gfx1012", "gfx1013"}),
    "gfx10-3-generic": frozenset({f"gfx103{n}" for n in range(7)}),
    "gfx11-generic": frozenset({"gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150",
                                "gfx1151", "gfx1152", "gfx1153"}),
    "gfx12-generic": frozenset({"gfx1200", "gfx1201"}),
})


@dataclass(frozen=True)
class RocmDevice:
    """One GPU as ggml-cuda's init listed it under HIP."""

    index: int
    name: str
    #: The processor, without target features: ``gfx942``.
    arch: str
    #: Target features as the runtime reports them: ``("sramecc+", "xnack-")``.
    features: tuple[str, ...] = ()

    @property
    def target(self) -> str:
        """The full target id, ``gfx942:sramecc+:xnack-``."""
        return ":".join((self.arch, *self.features))

    def label(self) -> str:
        return f"device {self.index} ({self.name}, {self.target})"


@dataclass(frozen=True)
class RocmLaunchEnv:
    """What a ROCm build's launch and probe add to the environment, and why."""

    environment: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    visible: tuple[RocmDevice, ...] = ()
    #: Devices hidden on purpose: the build has no code for them.
    hidden: tuple[RocmDevice, ...] = ()
    targets: tuple[str, ...] = ()
    reason: str = ""

    @property
    def all_hidden(self) -> bool:
        """Every listed device is hidden: the server will run on the CPU, on purpose."""
        return bool(self.hidden) and not self.visible

    def describe(self) -> str:
        """One line for the plan and the verdicts."""
        assigned = " ".join(f"{k}={v}" for k, v in sorted(self.environment.items()))
        return f"{assigned}: {self.reason}" if assigned else self.reason


def parse_rocm_devices(text: str) -> tuple[RocmDevice, ...]:
    """The HIP devices ggml-cuda's init listed in ``text`` (``--list-devices`` output or a
    server log), in its order; CUDA's device lines name no gfx target and are left out."""
    devices: dict[int, RocmDevice] = {}
    for line in text.splitlines():
        match = _DEVICE_LINE.search(line)
        if match is None:
            continue
        index = int(match["index"])
        features = tuple(f for f in match["features"].split(":") if f)
        devices.setdefault(index, RocmDevice(index, match["name"].strip(), match["arch"],
                                             features))
    return tuple(devices[i] for i in sorted(devices))


def build_targets(cmake_flags: Iterable[str]) -> tuple[str, ...]:
    """The gfx targets a build was configured with (``-DGPU_TARGETS=gfx1100;gfx942``);
    empty when none was named (ggml's default list, not recorded)."""
    targets: tuple[str, ...] = ()
    for flag in cmake_flags:
        name, _, value = flag.removeprefix("-D").partition("=")
        if name.partition(":")[0] in _TARGET_FLAGS:
            targets = tuple(t.strip() for t in re.split(r"[;,]", value) if t.strip())
    return targets


def runs_on(target: str, device: RocmDevice) -> bool:
    """Whether code built for ``target`` runs on ``device``: the same processor (or a
    generic target covering it), and every target feature the build fixed set alike on
    the device (a build for ``gfx90a:xnack-`` does not run with XNACK on; plain
    ``gfx90a`` runs either way)."""
    processor, *features = target.split(":")
    if processor != device.arch and device.arch not in GENERIC_TARGETS.get(processor, ()):
        return False
    return all(feature in device.features for feature in features)


def plan_rocm_env(targets: tuple[str, ...], devices: tuple[RocmDevice, ...], *,
                  inherited: Mapping[str, str],
                  kernel_packs: str | None = None) -> RocmLaunchEnv:
    """The launch environment of a ROCm build with ``targets`` on a host listing
    ``devices`` (listed without any planned hiding). ``inherited``: the environment the
    server would get anyway; ``kernel_packs``: the build's own rocBLAS library folder."""
    environment: dict[str, str] = {}
    if kernel_packs is not None and KERNEL_PACKS_VARIABLE not in inherited:
        environment[KERNEL_PACKS_VARIABLE] = kernel_packs

    def result(reason: str, visible: tuple[RocmDevice, ...] = devices,
               hidden: tuple[RocmDevice, ...] = ()) -> RocmLaunchEnv:
        return RocmLaunchEnv(MappingProxyType(environment), visible, hidden, targets, reason)

    chosen = [name for name in USER_VISIBILITY_VARIABLES if name in inherited]
    if chosen:
        return result(f"devices as the environment chose them "
                      f"({', '.join(f'{n}={inherited[n]}' for n in chosen)}): not planned over")
    if not devices:
        return result("no ROCm device listed: nothing to hide")
    if not targets:
        return result("the build's GPU targets are not recorded (ggml's default list): "
                      "every device stays visible")
    visible = tuple(d for d in devices if any(runs_on(t, d) for t in targets))
    hidden = tuple(d for d in devices if d not in visible)
    built_for = ", ".join(targets)
    if not hidden:
        return result(f"every device has code in the build ({built_for})")
    environment[VISIBILITY_VARIABLE] = (",".join(str(d.index) for d in visible)
                                        if visible else NONE_VISIBLE)
    left_out = "; ".join(d.label() for d in hidden)
    if not visible:
        return result(f"every device hidden on purpose, the build has code for {built_for} "
                      f"only: {left_out}", visible, hidden)
    return result(f"hidden on purpose, the build has no code for them ({built_for}): "
                  f"{left_out}", visible, hidden)
