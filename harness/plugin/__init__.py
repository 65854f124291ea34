"""The harness's pytest plugin, as one package.

- ``hooks`` — the plugin pytest loads (the ``pytest11`` entry point): its hooks, the
  ``--harness-*`` options and the fixtures the suites use;
- ``session`` — every option and ``HARNESS_*`` variable parsed once, and what they
  resolve to (the build, its devices, whether Docker answers), on ``config.stash``;
- ``required`` — ``HARNESS_TEST_REQUIRE``: a missing resource fails instead of skipping;
- ``flakes`` — the reviewed known-flakes list;
- ``unverified`` — the one-line-per-field summary of planned fields a build cannot show;
- ``recording`` — the run record and Allure details written while the suites run.

The names the suites annotate their fixtures with are re-exported here.
"""

from harness.plugin.hooks import BundleDir, LaunchPlanned, PlanFor, Server, StartServer
from harness.plugin.recording.fingerprints import RecordFingerprint
from harness.plugin.unverified import RecordUnverified

__all__ = ["BundleDir", "LaunchPlanned", "PlanFor", "RecordFingerprint", "RecordUnverified",
           "Server", "StartServer"]
