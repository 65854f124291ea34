"""The GPU access a container gets per backend (pure), and the checks against the machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import ConfigError
from harness.facts.build import Backend
from harness.facts.gpu import Vendor
from harness.planning.container_gpu import (
    DRI,
    KFD,
    ContainerGpuArgs,
    DevicePath,
    GpuAccess,
    plan_gpu_access,
    visible_devices,
)
from harness.probes.gpu_access import check_gpu_access


def test_the_cpu_backend_needs_no_device() -> None:
    assert plan_gpu_access(Backend.CPU, main_gpu=0) is None


def test_cuda_asks_the_nvidia_runtime_for_gpus() -> None:
    access = plan_gpu_access(Backend.CUDA, vendor=Vendor.NVIDIA)
    assert access is not None
    assert access.nvidia
    assert access.nvidia_capabilities == ("gpu",)
    assert access.devices == ()
    assert dict(access.environment) == {}


def test_rocm_passes_kfd_and_dri_with_the_video_and_render_groups() -> None:
    access = plan_gpu_access(Backend.ROCM, vendor=Vendor.AMD)
    assert access is not None
    assert not access.nvidia
    assert access.devices == (DevicePath(KFD, True), DevicePath(DRI, True))
    assert access.groups == ("video", "render")


@pytest.mark.parametrize(("vendor", "nvidia_caps", "dri_required"), [
    (None, (), False),
    (Vendor.AMD, (), True),
    (Vendor.INTEL, (), True),
    (Vendor.NVIDIA, ("gpu", "graphics", "compute", "utility"), False),
])
def test_vulkan_passes_dri_and_nvidia_graphics(vendor: Vendor | None,
                                                nvidia_caps: tuple[str, ...],
                                                dri_required: bool) -> None:
    access = plan_gpu_access(Backend.VULKAN, vendor=vendor)
    assert access is not None
    assert access.nvidia_capabilities == nvidia_caps
    assert access.devices == (DevicePath(DRI, dri_required),)


@pytest.mark.parametrize(("backend", "variables"), [
    (Backend.CUDA, {"CUDA_VISIBLE_DEVICES"}),
    (Backend.ROCM, {"HIP_VISIBLE_DEVICES"}),
    (Backend.VULKAN, {"GGML_VK_VISIBLE_DEVICES"}),
])
@pytest.mark.parametrize(("main_gpu", "visible"), [(0, "0"), (2, "0,1,2")])
def test_visibility_follows_the_main_gpu_and_keeps_host_numbering(
        backend: Backend, variables: set[str], main_gpu: int, visible: str) -> None:
    access = plan_gpu_access(backend, main_gpu=main_gpu)
    assert access is not None
    # --main-gpu N must still name host device N inside the container.
    assert dict(access.environment) == dict.fromkeys(variables, visible)


@pytest.mark.parametrize("backend", [Backend.CUDA, Backend.ROCM, Backend.VULKAN])
def test_no_main_gpu_leaves_every_device_visible(backend: Backend) -> None:
    access = plan_gpu_access(backend)
    assert access is not None
    assert dict(access.environment) == {}


def test_a_negative_main_gpu_is_refused() -> None:
    with pytest.raises(ValueError, match="main_gpu"):
        visible_devices(-1)


def test_docker_kwargs_of_nvidia_devices_and_groups() -> None:
    args = ContainerGpuArgs(nvidia_capabilities=("gpu",), devices=("/dev/kfd:/dev/kfd:rwm",),
                            group_ids=(44, 105))
    kwargs = args.to_create_kwargs()
    (request,) = kwargs["device_requests"]
    assert request["Count"] == -1
    assert request["Capabilities"] == [["gpu"]]
    assert kwargs["devices"] == ["/dev/kfd:/dev/kfd:rwm"]
    assert kwargs["group_add"] == ["44", "105"]
    assert ContainerGpuArgs().to_create_kwargs() == {}


def _rocm(tmp_path: Path, *, kfd: bool = True, dri: bool = True) -> GpuAccess:
    kfd_path, dri_path = tmp_path / "kfd", tmp_path / "dri"
    if kfd:
        kfd_path.write_bytes(b"")
    if dri:
        dri_path.mkdir()
        (dri_path / "renderD128").write_bytes(b"")
    access = plan_gpu_access(Backend.ROCM, main_gpu=0, kfd=kfd_path, dri=dri_path)
    assert access is not None
    return access


_GIDS = {"video": 44, "render": 105}


def test_rocm_check_resolves_devices_and_host_group_ids(tmp_path: Path) -> None:
    args = check_gpu_access(_rocm(tmp_path), {"runc": {}}, group_id=_GIDS.get,
                            accessible=lambda _: True)
    assert args.devices == (f"{tmp_path / 'kfd'}:{tmp_path / 'kfd'}:rwm",
                            f"{tmp_path / 'dri'}:{tmp_path / 'dri'}:rwm")
    assert args.group_ids == (44, 105)
    assert dict(args.environment) == {"HIP_VISIBLE_DEVICES": "0"}


def test_a_group_the_host_lacks_is_left_out(tmp_path: Path) -> None:
    args = check_gpu_access(_rocm(tmp_path), {}, group_id={"video": 44}.get,
                            accessible=lambda _: True)
    assert args.group_ids == (44,)


def test_a_missing_kfd_names_the_device_and_the_groups(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"kfd, which does not exist.*video, render"):
        check_gpu_access(_rocm(tmp_path, kfd=False), {}, group_id=_GIDS.get,
                         accessible=lambda _: True)


def test_an_inaccessible_kfd_names_the_device_and_the_groups(tmp_path: Path) -> None:
    kfd = tmp_path / "kfd"
    with pytest.raises(ConfigError, match=rf"{kfd} exists but .*video, render"):
        check_gpu_access(_rocm(tmp_path), {}, group_id=_GIDS.get,
                         accessible=lambda path: path != kfd)


def test_dri_access_is_judged_by_its_render_nodes(tmp_path: Path) -> None:
    render = tmp_path / "dri" / "renderD128"
    with pytest.raises(ConfigError, match=rf"{render} exists but"):
        check_gpu_access(_rocm(tmp_path), {}, group_id=_GIDS.get,
                         accessible=lambda path: path == tmp_path / "kfd")


def test_cuda_without_the_nvidia_runtime_names_the_toolkit() -> None:
    access = plan_gpu_access(Backend.CUDA)
    assert access is not None
    with pytest.raises(ConfigError, match=r"no 'nvidia' runtime \(it has: runc\).*"
                                          r"NVIDIA container toolkit"):
        check_gpu_access(access, {"runc": {}})


def test_cuda_with_the_nvidia_runtime_passes() -> None:
    access = plan_gpu_access(Backend.CUDA, main_gpu=1)
    assert access is not None
    args = check_gpu_access(access, {"runc": {}, "nvidia": {}})
    assert args.nvidia_capabilities == ("gpu",)
    assert args.devices == ()
    assert args.group_ids == ()
    assert dict(args.environment) == {"CUDA_VISIBLE_DEVICES": "0,1"}


def test_vulkan_without_dri_still_starts_on_a_software_device(tmp_path: Path) -> None:
    access = plan_gpu_access(Backend.VULKAN, main_gpu=0, dri=tmp_path / "no-dri")
    assert access is not None
    args = check_gpu_access(access, {}, group_id=_GIDS.get)
    assert args.devices == ()
    assert args.group_ids == ()
    assert dict(args.environment) == {"GGML_VK_VISIBLE_DEVICES": "0"}


def test_vulkan_on_an_amd_card_requires_dri(tmp_path: Path) -> None:
    access = plan_gpu_access(Backend.VULKAN, vendor=Vendor.AMD, dri=tmp_path / "no-dri")
    assert access is not None
    with pytest.raises(ConfigError, match="no-dri, which does not exist"):
        check_gpu_access(access, {})
