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

#: ``--distro`` words → Debian suite codenames.
SUITES = {"debian:12": "bookworm", "debian:13": "trixie"}
IMAGE_REPOSITORY = "harness-base/debian"
KEY_LABEL = "org.llama-harness.base-key"
#: Bumped when the way a base is made changes, so older images are not reused.
RECIPE_VERSION = 1
_DEB822_URI = re.compile(r"^URIs:\s*(\S+)", re.MULTILINE)
_ONE_LINE_DEB = re.compile(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+\S+", re.MULTILINE)


@dataclass(frozen=True)
class BaseImagePlan:
    distro: str
    suite: str
    mirror: str
    variant: str
    key: str

    @property
    def tag(self) -> str:
        return f"{IMAGE_REPOSITORY}:{self.distro.split(':', 1)[1]}"

    def debootstrap_argv(self, target: str) -> list[str]:
        return ["debootstrap", f"--variant={self.variant}", self.suite, target, self.mirror]


def plan_base_image(distro: str, mirror: str, debootstrap_version: str,
                    variant: str = "minbase") -> BaseImagePlan:
    if distro not in SUITES:
        raise ConfigError(f"unknown distro {distro!r}; known: {', '.join(sorted(SUITES))}")
    payload = json.dumps({"recipe": RECIPE_VERSION, "distro": distro, "mirror": mirror,
                          "variant": variant, "debootstrap": debootstrap_version},
                         sort_keys=True)
    key = hashlib.sha256(payload.encode()).hexdigest()[:16]
    return BaseImagePlan(distro, SUITES[distro], mirror, variant, key)


def debian_mirror(sources: list[str]) -> str | None:
    """The first Debian archive URI in the host's apt sources (deb822 or one-line form).

    Security and updates archives are skipped: debootstrap needs the main archive.
    """
    for text in sources:
        for uri in [*_DEB822_URI.findall(text), *_ONE_LINE_DEB.findall(text)]:
            if "security" not in uri and "debian" in uri:
                return str(uri).rstrip("/")
    return None
