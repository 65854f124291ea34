"""A locally made Debian base image: which suite, which mirror, and its cache key (pure).

No image registry is reachable on our machines, so base images are made with
``debootstrap`` from the host's own Debian mirror and ``docker import``-ed. The image is
named by the distro and labelled with a key over everything that shapes its contents,
so the same inputs are a cache hit and a change makes a new image.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from harness.errors import ConfigError

#: ``--distro`` words → Debian suite codenames. sid is there for ROCm: ggml's HIP backend
#: needs HIP ≥ 6.1 and only sid carries it (docs/design.md).
SUITES = {"debian:12": "bookworm", "debian:13": "trixie", "debian:sid": "sid"}
#: Debian's archive areas. ``non-free`` holds NVIDIA's CUDA toolkit, ``contrib`` what
#: builds on it; ``main`` is always there (debootstrap needs it).
COMPONENTS = ("main", "contrib", "non-free", "non-free-firmware")
DEFAULT_COMPONENTS = ("main",)
#: Suites whose Release file expires within days (see ``BaseImagePlan.apt_config``).
_SHORT_VALIDITY = frozenset({"sid"})
IMAGE_REPOSITORY = "harness-base/debian"
KEY_LABEL = "org.llama-harness.base-key"
#: Bumped when the way a base is made changes, so older images are not reused.
#: 2: the archive components joined the key; sid bases accept an expired Release file.
RECIPE_VERSION = 2
_DEB822_URI = re.compile(r"^URIs:\s*(\S+)", re.MULTILINE)
_ONE_LINE_DEB = re.compile(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+\S+", re.MULTILINE)


@dataclass(frozen=True)
class BaseImagePlan:
    distro: str
    suite: str
    mirror: str
    variant: str
    key: str
    components: tuple[str, ...] = DEFAULT_COMPONENTS

    @property
    def tag(self) -> str:
        """``harness-base/debian:13``, with the extra areas when there are any
        (``harness-base/debian:13-contrib-non-free``), so each set has its own image."""
        extra = [c for c in self.components if c != "main"]
        return f"{IMAGE_REPOSITORY}:{'-'.join([self.distro.split(':', 1)[1], *extra])}"

    @property
    def apt_config(self) -> str | None:
        """apt settings the image needs, written to ``/etc/apt/apt.conf.d/``.

        sid's Release file is valid for a week only (stable releases carry no
        Valid-Until); a mirror that serves a snapshot of the archive then makes every
        ``apt-get update`` in the image fail as expired, so a sid base accepts it.
        The signatures are still checked.
        """
        if self.suite in _SHORT_VALIDITY:
            return 'Acquire::Check-Valid-Until "false";\n'
        return None

    def debootstrap_argv(self, target: str) -> list[str]:
        # debootstrap writes the same components into the image's sources.list, so apt
        # inside the image sees the areas the base was made from.
        return ["debootstrap", f"--variant={self.variant}",
                f"--components={','.join(self.components)}", self.suite, target, self.mirror]


def plan_base_image(distro: str, mirror: str, debootstrap_version: str,
                    variant: str = "minbase",
                    components: tuple[str, ...] = DEFAULT_COMPONENTS) -> BaseImagePlan:
    if distro not in SUITES:
        raise ConfigError(f"unknown distro {distro!r}; known: {', '.join(sorted(SUITES))}")
    chosen = normalize_components(components)
    payload = json.dumps({"recipe": RECIPE_VERSION, "distro": distro, "mirror": mirror,
                          "variant": variant, "debootstrap": debootstrap_version,
                          "components": list(chosen), "apt_config": _apt_config_key(distro)},
                         sort_keys=True)
    key = hashlib.sha256(payload.encode()).hexdigest()[:16]
    return BaseImagePlan(distro, SUITES[distro], mirror, variant, key, chosen)


def _apt_config_key(distro: str) -> bool:
    return SUITES[distro] in _SHORT_VALIDITY


def normalize_components(components: tuple[str, ...]) -> tuple[str, ...]:
    """``main`` first, then the others in the archive's order, each once; unknown refused."""
    unknown = sorted(set(components) - set(COMPONENTS))
    if unknown:
        raise ConfigError(f"unknown Debian archive component {unknown[0]!r}; known: "
                          f"{', '.join(COMPONENTS)}")
    return tuple(c for c in COMPONENTS if c == "main" or c in components)


def debian_mirror(sources: list[str]) -> str | None:
    """The first Debian archive URI in the host's apt sources (deb822 or one-line form).

    Security and updates archives are skipped: debootstrap needs the main archive.
    """
    for text in sources:
        for uri in [*_DEB822_URI.findall(text), *_ONE_LINE_DEB.findall(text)]:
            if "security" not in uri and "debian" in uri:
                return str(uri).rstrip("/")
    return None
