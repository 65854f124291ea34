"""Local Debian base images: the plan (pure) and a real debootstrap + docker import."""

from __future__ import annotations

import os
import time
from pathlib import Path

import docker
import pytest
from fake_docker import API_VERSION, fake_engine
from test_bounded_waits import all_gone, hang_program

from harness import bounded
from harness.builds import base_image
from harness.builds.base_image import ensure_base_image, host_mirror
from harness.errors import BuildError, ConfigError, ToolMissingError
from harness.planning.base_image import KEY_LABEL, debian_mirror, plan_base_image
from harness.probes.docker_engine import docker_engine

DEB822 = """Types: deb
URIs: http://mirror.invalid/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://mirror.invalid/debian-security
Suites: bookworm-security
"""


@pytest.mark.parametrize(("texts", "mirror"), [
    pytest.param([DEB822], "http://mirror.invalid/debian", id="deb822"),
    pytest.param(["deb http://m.invalid/debian bookworm main\n"], "http://m.invalid/debian",
                 id="one-line"),
    pytest.param(["deb [arch=amd64] http://m.invalid/debian/ bookworm main\n"],
                 "http://m.invalid/debian", id="one-line-with-options"),
    pytest.param(["URIs: http://m.invalid/debian-security\n"], None, id="security-only"),
    pytest.param([], None, id="no-sources"),
])
def test_the_mirror_comes_from_the_hosts_apt_sources(texts: list[str],
                                                     mirror: str | None) -> None:
    assert debian_mirror(texts) == mirror


def test_the_plan_names_suite_tag_and_a_content_key() -> None:
    plan = plan_base_image("debian:13", "http://m.invalid/debian", "debootstrap 1.0")
    assert plan.suite == "trixie"
    assert plan.tag == "harness-base/debian:13"
    assert plan.debootstrap_argv("/t") == ["debootstrap", "--variant=minbase",
                                           "--components=main", "trixie", "/t",
                                           "http://m.invalid/debian"]
    assert plan.apt_config is None
    assert plan.key == plan_base_image("debian:13", "http://m.invalid/debian",
                                       "debootstrap 1.0").key
    others = {plan_base_image("debian:12", "http://m.invalid/debian", "debootstrap 1.0").key,
              plan_base_image("debian:13", "http://other.invalid/debian", "debootstrap 1.0").key,
              plan_base_image("debian:13", "http://m.invalid/debian", "debootstrap 2.0").key}
    assert plan.key not in others


def test_components_and_sid_make_their_own_images_and_keys() -> None:
    main = plan_base_image("debian:13", "http://m.invalid/debian", "1.0")
    nonfree = plan_base_image("debian:13", "http://m.invalid/debian", "1.0",
                              components=("non-free", "contrib"))
    sid = plan_base_image("debian:sid", "http://m.invalid/debian", "1.0")
    # main always comes first and the areas in the archive's order, however given.
    assert nonfree.components == ("main", "contrib", "non-free")
    assert nonfree.tag == "harness-base/debian:13-contrib-non-free"
    assert "--components=main,contrib,non-free" in nonfree.debootstrap_argv("/t")
    assert len({main.key, nonfree.key, sid.key}) == 3
    assert sid.suite == "sid"
    assert sid.tag == "harness-base/debian:sid"
    # sid's Release file expires within a week; a snapshot mirror must still work.
    assert sid.apt_config is not None
    assert "Check-Valid-Until" in sid.apt_config


def test_an_unknown_component_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown Debian archive component 'universe'; "
                                          r"known: main, contrib, non-free"):
        plan_base_image("debian:13", "http://m.invalid/debian", "1.0",
                        components=("main", "universe"))


def test_an_unknown_distro_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown distro 'ubuntu:24.04'; known: debian:12"):
        plan_base_image("ubuntu:24.04", "http://m.invalid/debian", "x")


def test_no_engine_says_how_to_start_one(monkeypatch: pytest.MonkeyPatch,
                                         tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such.sock")
    with pytest.raises(ConfigError, match=r"no Docker engine answers.*dockerd --bridge=none"):
        docker_engine()


@pytest.mark.docker
def test_missing_debootstrap_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    client = docker_engine()
    with pytest.raises(ToolMissingError, match=r"apt-get install debootstrap"):
        ensure_base_image(client, "debian:12", tmp_path)


@pytest.mark.docker
def test_a_base_image_is_made_runs_and_is_then_a_cache_hit(tmp_path: Path) -> None:
    client = docker_engine()
    plan = plan_base_image("debian:12", host_mirror(), "unused")
    for image in client.images.list(name=plan.tag.split(":")[0]):
        if plan.tag in image.tags:
            client.images.remove(plan.tag, force=True)  # make it for real, every run
    made = ensure_base_image(client, "debian:12", tmp_path)
    assert not made.cache_hit
    assert made.tag == "harness-base/debian:12"
    assert client.images.get(made.tag).labels[KEY_LABEL] == made.key
    output = client.containers.run(made.tag, ["cat", "/etc/debian_version"],
                                   network_mode="host", remove=True)
    assert output.decode().startswith("12.")
    again = ensure_base_image(client, "debian:12", tmp_path)
    assert again.cache_hit
    assert again.image_id == made.image_id


def test_a_debootstrap_that_hangs_is_stopped_at_its_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base_image, "DEBOOTSTRAP_LIMIT_S", 1.0)
    monkeypatch.setattr(bounded, "TERM_GRACE_S", 0.5)
    tools = tmp_path / "bin"
    tools.mkdir()
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    with hang_program(tmp_path) as (hangs, pids), fake_engine() as engine:
        # A debootstrap that says its version, then hangs as one stuck on a mirror does.
        fake = tools / "debootstrap"
        fake.write_text(f'#!/bin/sh\n[ "$1" = --version ] && {{ echo 1.0.999; exit 0; }}\n'
                        f"exec {hangs}\n")
        fake.chmod(0o755)
        # The engine has no base image yet: it is made.
        client = docker.DockerClient(base_url=engine.url, version=API_VERSION, timeout=10)
        started = time.monotonic()
        with pytest.raises(BuildError) as raised:
            ensure_base_image(client, "debian:13", tmp_path / "work")
        took = time.monotonic() - started
        client.close()
        assert all_gone(pids)
    text = str(raised.value)
    assert "debootstrap trixie did not finish within its limit of 1 s" in text
    assert "harness.builds.base_image.DEBOOTSTRAP_LIMIT_S" in text
    assert "debootstrap-13.log" in text
    assert took < 1 + 0.5 + 5
