"""``harness base-image``: make a Debian base image locally (debootstrap + docker import).

The mirror is the host's own apt configuration, so a machine that can ``apt-get
install`` can make a base. The image is tagged ``harness-base/debian:<version>`` and
labelled with the plan's key; an image carrying the key already is returned as is.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.bounded import run_step
from harness.errors import BuildError, ToolMissingError
from harness.planning.base_image import (
    DEFAULT_COMPONENTS,
    KEY_LABEL,
    BaseImagePlan,
    debian_mirror,
    plan_base_image,
)

APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
LOG_TAIL_LINES = 40
#: Seconds debootstrap may take: a few minutes from a nearby mirror, far more from a
#: slow one; a run past this is stuck on the network or a lock.
DEBOOTSTRAP_LIMIT_S = 3600.0
#: Seconds a quick tool call (``debootstrap --version``, ``umount --lazy``) may take.
TOOL_LIMIT_S = 60.0


@dataclass(frozen=True)
class BaseImage:
    tag: str
    image_id: str
    key: str
    cache_hit: bool


def ensure_base_image(client: Any, distro: str, work_dir: Path,
                      components: tuple[str, ...] = DEFAULT_COMPONENTS) -> BaseImage:
    """The base image for ``distro`` with these archive components, made now if the
    engine has none with its key."""
    plan = plan_base_image(distro, host_mirror(), _debootstrap_version(),
                           components=components)
    for image in client.images.list(filters={"label": f"{KEY_LABEL}={plan.key}"}):
        if plan.tag in image.tags:
            return BaseImage(plan.tag, image.id, plan.key, cache_hit=True)
    return BaseImage(plan.tag, _make(client, plan, work_dir), plan.key, cache_hit=False)


def host_mirror() -> str:
    texts: list[str] = []
    for path in APT_SOURCES:
        files = sorted(path.glob("*.sources")) + sorted(path.glob("*.list")) if path.is_dir() \
            else [path]
        texts += [f.read_text(errors="replace") for f in files if f.is_file()]
    mirror = debian_mirror(texts)
    if mirror is None:
        raise BuildError("found no Debian archive in the host's apt sources "
                         f"({', '.join(map(str, APT_SOURCES))}); debootstrap needs one")
    return mirror


def _debootstrap_version() -> str:
    if shutil.which("debootstrap") is None:
        raise ToolMissingError("debootstrap is not installed; install it with "
                               "`apt-get install debootstrap` (it makes the local base images)")
    try:
        proc = subprocess.run(["debootstrap", "--version"], capture_output=True, text=True,
                              check=False, timeout=TOOL_LIMIT_S)
    except subprocess.TimeoutExpired as exc:
        raise BuildError(f"`debootstrap --version` did not answer within "
                         f"{TOOL_LIMIT_S:g} s; check the debootstrap install") from exc
    return proc.stdout.strip() or "unknown"


def _make(client: Any, plan: BaseImagePlan, work_dir: Path) -> str:
    work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work_dir, prefix="debootstrap-") as tmp:
        root = Path(tmp) / "root"
        log_path = work_dir / f"debootstrap-{plan.tag.rsplit(':', 1)[1]}.log"
        try:
            with log_path.open("w", buffering=1) as log:
                code = run_step(plan.debootstrap_argv(str(root)),
                                step=f"debootstrap {plan.suite}",
                                limit_s=DEBOOTSTRAP_LIMIT_S, error=BuildError,
                                setting="harness.builds.base_image.DEBOOTSTRAP_LIMIT_S",
                                log_path=log_path,
                                on_line=lambda line: log.write(line + "\n")).code
        finally:
            # debootstrap unmounts on exit, SIGTERM included; one stopped harder leaves
            # the host's /dev or /proc bound inside root, which the cleanup would empty.
            _unmount_under(root)
        if code != 0:
            tail = log_path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            raise BuildError(f"debootstrap {plan.suite} failed (exit {code}); last lines:\n"
                             + "\n".join(tail) + f"\nfull log: {log_path}")
        if plan.apt_config is not None:
            (root / "etc/apt/apt.conf.d/99harness-base").write_text(plan.apt_config)
        archive = Path(tmp) / "root.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(root, arcname=".")
        repository, tag = plan.tag.split(":", 1)
        client.api.import_image_from_file(
            str(archive), repository=repository, tag=tag,
            changes=[f'LABEL {KEY_LABEL}="{plan.key}"', 'CMD ["/bin/bash"]'])
    image = client.images.get(plan.tag)
    return str(image.id)


def _unmount_under(root: Path) -> None:
    """Detach every mount below ``root``, deepest first (``umount --lazy``)."""
    try:
        table = Path("/proc/self/mounts").read_text()
    except OSError:
        return
    # /proc/self/mounts writes a space in a path as \040.
    points = [line.split()[1].replace("\\040", " ") for line in table.splitlines()
              if len(line.split()) > 1]
    below = sorted((p for p in points if p.startswith(f"{root}/")), key=len, reverse=True)
    for point in below:
        subprocess.run(["umount", "--lazy", point], capture_output=True, check=False,
                       timeout=TOOL_LIMIT_S)
