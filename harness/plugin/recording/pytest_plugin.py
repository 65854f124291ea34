"""The recording half of the pytest plugin: Allure labels and attachments, figures, run.json.

Registered by ``harness.plugin`` in every process. In each test it labels the Allure
result (parent suite = the hardware, so one report can hold many runners), attaches
each plan, argv, supervisor attempt, verdict, ``/props`` and startup log, and — when a
run record is asked for — measures every server before it stops and appends the
figures to this worker's file. The controller (the only process under xdist that sees
every report) writes ``environment.properties``, ``categories.json`` and ``run.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import allure
import pytest

from harness.builds.container_build import image_id
from harness.builds.under_test import BuildUnderTest
from harness.errors import HarnessError
from harness.perf.keys import figures
from harness.plugin.recording import story
from harness.plugin.recording.fingerprints import fingerprint_of_properties
from harness.plugin.recording.outcomes import OutcomeTally
from harness.plugin.recording.recorder import MeasureSettings, ServerRecorder, TestCapture
from harness.plugin.recording.run_file import (
    append_figures,
    build_ref,
    environment_properties,
    new_run_id,
    now_iso,
    read_figures,
    run_record,
    write_run,
)
from harness.plugin.recording.source_labels import source_labels
from harness.plugin.session import HarnessSession
from harness.probes.docker_engine import docker_engine
from harness.probes.hardware import detect_hardware
from harness.repro.properties import repro_properties
from harness.results.run_record import Hardware
from harness.runners.observe import add_observer, remove_observer

_FAILED = pytest.StashKey[bool]()
JSON = allure.attachment_type.JSON
TEXT = allure.attachment_type.TEXT
#: allure-pytest ships no type hints; every call goes through this one untyped name.
_dynamic: Any = allure.dynamic


def figures_dir(run_json: Path) -> Path:
    return run_json.with_name(run_json.name + ".figures")


class RecordingPlugin:
    def __init__(self, config: pytest.Config, session: HarnessSession) -> None:
        self.config = config
        #: The harness session: the options, and the build once something resolved it
        #: (a unit-test run must not build llama-server just to label its results).
        self.session = session
        self.run_json = session.options.run_record
        self.is_worker = hasattr(config, "workerinput")
        self.worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.recorder = ServerRecorder(MeasureSettings(enabled=self.run_json is not None))
        self.tally = OutcomeTally()
        #: Test id -> its numerics fingerprint (JSON), from the reports' user properties.
        self.fingerprints: dict[str, dict[str, Any]] = {}
        self.started_at = now_iso()
        self._hardware: Hardware | None = None
        add_observer(self.recorder)
        if self.run_json is not None and not self.is_worker:
            shutil.rmtree(figures_dir(self.run_json), ignore_errors=True)

    @property
    def hardware(self) -> Hardware:
        if self._hardware is None:
            try:
                devices = self.session.devices() if self.session.resolved_build else ()
            except HarnessError:
                # A build that cannot list its devices (one that cannot run on this CPU)
                # still has its results labelled, with the host's hardware alone.
                devices = ()
            self._hardware = detect_hardware(devices)
        return self._hardware

    def close(self) -> None:
        remove_observer(self.recorder)

    # -- per test ---------------------------------------------------------------------

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_call(self, item: pytest.Item) -> None:
        build: BuildUnderTest | None = self.session.resolved_build
        if build is not None and self.recorder.settings.backend != build.backend.value:
            self.recorder.settings = MeasureSettings(
                enabled=self.recorder.settings.enabled, backend=build.backend.value,
                gpu=self.hardware.gpu)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        # Before allure-pytest adds its default suites, so ours are the ones kept.
        _dynamic.parent_suite(self.hardware.describe())
        owner = getattr(item, "module", None)
        module = owner.__name__.rsplit(".", 1)[-1] if owner is not None else item.name
        _dynamic.suite(module)
        _dynamic.feature(story.feature_of(module))
        # `harness repro` finds the test again by it (Allure's fullName drops the path).
        _dynamic.label("nodeid", item.nodeid)
        build: BuildUnderTest | None = self.session.resolved_build
        if build is not None:
            _dynamic.label("backend", build.backend.value)
            _dynamic.label("build", build.key)
        _dynamic.label("gpu", self.hardware.gpu)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item,
                                  call: pytest.CallInfo[None]) -> Any:
        outcome = yield
        report: pytest.TestReport = outcome.get_result()
        # An expected failure (a known flake among them) failed too: keep its whole log.
        if report.failed or (report.skipped and hasattr(report, "wasxfail")):
            item.stash[_FAILED] = True
        if report.when == "teardown":
            capture = self.recorder.take()
            try:
                self._attach(capture, failed=item.stash.get(_FAILED, False))
            except Exception as exc:  # the report is worth less than the test run itself
                warnings.warn(f"harness could not attach {item.nodeid}'s servers to the "
                              f"Allure report: {type(exc).__name__}: {exc}", RuntimeWarning,
                              stacklevel=1)
            if self.run_json is not None:
                append_figures(figures_dir(self.run_json) / f"{self.worker}.jsonl",
                               [f for record in capture.servers if record.key is not None
                                for f in figures(item.nodeid, record.key, record.figures,
                                                 record.predicted)])

    def _attach(self, capture: TestCapture, *, failed: bool) -> None:
        build: BuildUnderTest | None = self.session.resolved_build
        backend = build.backend.value if build is not None else "cpu"
        for number, plan in enumerate(capture.plans, 1):
            allure.attach(_dump(plan.to_json()), f"plan {number}", JSON)
        for number, supervised in enumerate(capture.supervised, 1):
            allure.attach(_dump(story.attempts_json(supervised)),
                          f"supervisor attempts {number}", JSON)
        fixtures = sorted({record.spec.model.stem for record in capture.servers})
        for name in fixtures:
            _dynamic.label("fixture", name)
        for number, record in enumerate(capture.servers, 1):
            prefix = f"server {number}"
            allure.attach(" ".join(record.argv) + "\n", f"{prefix} argv", TEXT)
            try:
                log_text = record.log_path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                log_text = ""
            allure.attach(_dump(story.verdicts_json(record, log_text, backend)),
                          f"{prefix} verdicts", JSON)
            if record.props is not None:
                allure.attach(_dump(record.props), f"{prefix} /props", JSON)
            if record.figures or record.measure_error:
                allure.attach(_dump(story.figures_json(record)), f"{prefix} figures", JSON)
            whole = failed or record.ready_at is None
            allure.attach(story.trimmed_log(log_text, whole=whole),
                          f"{prefix} startup log{'' if whole else ' (trimmed)'}", TEXT)

    # -- per session (the controller) -----------------------------------------------------

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        message = None
        if report.failed or report.skipped:
            longrepr = report.longrepr
            if isinstance(longrepr, tuple):
                message = str(longrepr[2])
            elif longrepr is not None:
                message = str(getattr(longrepr, "reprcrash", None) or longrepr)[:2000]
        self.tally.add(report.nodeid, report.when or "call", report.outcome, report.duration,
                       message=message, wasxfail=hasattr(report, "wasxfail"))
        fingerprint = fingerprint_of_properties(report.user_properties)
        if fingerprint is not None:
            self.fingerprints[report.nodeid] = fingerprint

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.is_worker:
            return
        alluredir = getattr(self.config.option, "allure_report_dir", None)
        if alluredir is None and self.run_json is None:
            return
        build: BuildUnderTest | None = self.session.resolved_build
        if build is None and self._names_a_build():
            build = self.session.build()
        image = self.session.run_image() if build is not None else None
        ref = (build_ref(build.info, build.key, image_id=_image_id(image))
               if build is not None else None)
        if alluredir is not None:
            from harness.report.allure_meta import (  # noqa: PLC0415 (only with a report)
                write_categories,
                write_environment,
            )

            results = Path(alluredir)
            results.mkdir(parents=True, exist_ok=True)
            base_images = (build.info.base_image_digest
                            if build is not None and build.info is not None else None)
            release = (build.info.release
                       if build is not None and build.info is not None else None)
            props = environment_properties(self.hardware, ref, image, base_images, release)
            # What `harness repro` needs to run a test again exactly as here.
            props.update(repro_properties(
                cmake_flags=build.info.cmake_flags if build is not None and build.info else None,
                planner_gpu=self.session.options.planner_gpu, rootdir=self.config.rootpath))
            write_environment(results, props)
            write_categories(results)
        if self.run_json is not None and ref is not None:
            record = run_record(run_id=new_run_id(), started_at=self.started_at,
                                hardware=self.hardware, build=ref,
                                outcomes=self.tally.outcomes(),
                                figures=read_figures(figures_dir(self.run_json)),
                                labels=source_labels(build.info if build is not None
                                                     else None),
                                numerics=self.fingerprints)
            write_run(self.run_json, record)

    def _names_a_build(self) -> bool:
        """Whether this session is about a build, so ending it may resolve (even build) it.

        A run record always is; so is a session given a build or a binary. A session
        that only ran unit tests with Allure on never touched one and will not build
        llama-server just to fill in the report's environment.
        """
        return self.run_json is not None or self.session.options.names_a_build



def _image_id(image: str | None) -> str | None:
    """The engine's id (sha256 digest of the config) of ``image``; None when unknown."""
    if image is None:
        return None
    try:
        client = docker_engine()
        try:
            return image_id(client, image)
        finally:
            client.close()
    except Exception:  # an engine gone at session end costs only this one property
        return None


def _dump(body: Any) -> str:
    return json.dumps(body, indent=2, sort_keys=True, default=str)
