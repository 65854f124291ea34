"""Capture a real startup log from a llama-server image into the verdicts' corpus.

    .venv/bin/python scripts/capture_log.py --image IMAGE --model dense \\
        --out tests/data/logs/cuda/captured-no-driver.log [--env NAME=VALUE ...] [--note TEXT]

Starts the image through the container runner with **no GPU access** (the explicit
``gpu=None``: the events worth capturing here are a GPU build on a machine without its
GPU), with the suites' argv (``-lv 4``, ``--port 0``), waits until the server serves or
exits, stops it, and writes the log byte for byte plus the frame of its sidecar: the
provenance ("captured: image, argv, date") and the exit code. It prints the verdicts the
parsers give today; the sidecar's expectations are written by whoever read the log
(tests/data/logs/README.md).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from harness import modelgen
from harness.builds.container_build import BUILD_LABEL
from harness.errors import ServerExitedError, ServerNotReadyError
from harness.facts.build import BuildInfo
from harness.planning.launch import LaunchSpec
from harness.probes.docker_engine import docker_engine
from harness.runners.container_runner import ContainerRunner
from harness.runners.readiness import wait_until_ready
from harness.verdicts.failure import classify_start_failure
from harness.verdicts.gpu_use import gpu_verdict


def _image_words(image: str) -> tuple[str, str]:
    """A readable name of the image's build, and its backend."""
    client = docker_engine()
    try:
        label = client.images.get(image).labels.get(BUILD_LABEL)
    finally:
        client.close()
    if not label:
        return image, "cpu"
    info = BuildInfo.from_json(json.loads(label))
    flags = " ".join(f for f in info.cmake_flags if "ARCH" in f or "TARGETS" in f or "_FA=" in f)
    return f"{image} ({info.backend.value} build, {flags})", info.backend.value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", required=True)
    parser.add_argument("--model", default="dense", help="fixture name")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--ngl", type=int, default=99)
    parser.add_argument("--note", default="", help="what the capture shows, for the provenance")
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.env)
    model = modelgen.ensure_fixtures(None).model(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        runner = ContainerRunner(args.image, Path(tmp), ready_timeout_s=120, env=env, gpu=None)
        spec = LaunchSpec(model=model, ctx_size=512, n_gpu_layers=args.ngl)
        server = runner.launch(spec)
        timed_out = False
        try:
            wait_until_ready(server, runner.conditions, runner.ready_timeout_s)
            code: int | None = None
        except (ServerExitedError, ServerNotReadyError):  # what is being captured
            code = server.exit_code()
            timed_out = code is None
        finally:
            server.stop()
        log = server.log_path.read_bytes()
    argv = " ".join(["llama-server", *server.argv[1:]]).replace(str(model), args.model)
    described, backend = _image_words(args.image)
    env_words = " ".join(f"{k}={v}" for k, v in env.items())
    provenance = (f"captured: {described}, no GPU access (container runner gpu=None"
                  f"{', env ' + env_words if env_words else ''}), fixture {args.model}, argv "
                  f"`{argv}`, {time.strftime('%Y-%m-%d')}"
                  + (f"; {args.note}" if args.note else ""))
    text = log.decode("utf-8", errors="replace")
    verdict = gpu_verdict(text, backend)
    # Only the frame: what the log shows is written in by whoever read it.
    sidecar: dict[str, object] = {"provenance": provenance, "exit_code": code,
                                  "expected": {"gpu": {"expected_backend": backend}}}
    print(f"today's verdict: passed={verdict.passed}, "
          + ", ".join(f"{b.role.value}: {b.state.value}" for b in verdict.blocks))
    if code is not None or timed_out:
        failure = classify_start_failure(code, text, timed_out)
        print(f"today's failure class: {failure}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(log)
    args.out.with_suffix(".json").write_text(json.dumps(sidecar, indent=2) + "\n")
    print(f"{args.out}: exit {code}, {len(log)} bytes; review {args.out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
