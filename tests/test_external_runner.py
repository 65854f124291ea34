"""The external runner: tests attach to a real llama-server someone else started.

The "developer's" server is started here with the subprocess runner (the dense fixture,
the cached CPU build); the external runner must find it healthy, hand it out, and leave
it running when the test is done.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import service_helpers

from harness import modelgen
from harness.client import ServerClient
from harness.errors import ConfigError, ServerNotReadyError
from harness.planning.launch import LaunchSpec
from harness.runners.external_runner import ExternalRunner, check_url
from harness.runners.subprocess_runner import SubprocessRunner, SubprocessServer

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def developers_server(llama_server_binary: Path, fixture_set: modelgen.FixtureSet,
                      tmp_path_factory: pytest.TempPathFactory) -> Iterator[SubprocessServer]:
    runner = SubprocessRunner(llama_server_binary, tmp_path_factory.mktemp("dev-server"))
    with runner.start(LaunchSpec(model=fixture_set.model("dense"), ctx_size=512)) as server:
        yield server


def test_start_returns_the_external_server_and_stop_leaves_it_running(
        developers_server: SubprocessServer, fixture_set: modelgen.FixtureSet,
        tmp_path: Path) -> None:
    runner = ExternalRunner(developers_server.base_url + "/", tmp_path)
    spec = LaunchSpec(model=fixture_set.model("dense"), ctx_size=1024)
    server = runner.start(spec)
    assert server.base_url == developers_server.base_url
    assert server.exit_code() is None
    # The argv is what the test asked for, at the external address: not what runs there.
    port = str(developers_server.port)
    assert server.argv[server.argv.index("--port") + 1] == port
    assert server.argv[server.argv.index("--ctx-size") + 1] == "1024"
    note = server.log_text()
    assert f"external llama-server at {developers_server.base_url}" in note
    assert "launch flags are the developer's responsibility" in note
    assert server.log_tail(1) == [note.splitlines()[-1]]
    assert server.stop() is None
    assert developers_server.exit_code() is None
    with ServerClient(developers_server.base_url) as client:
        assert client.health().ok


def test_no_server_at_the_address_names_it_and_the_fix(tmp_path: Path,
                                                       fixture_set: modelgen.FixtureSet) -> None:
    url = f"http://127.0.0.1:{service_helpers.free_port()}"
    runner = ExternalRunner(url, tmp_path, ready_timeout_s=0.5)
    with pytest.raises(ServerNotReadyError) as caught:
        runner.start(LaunchSpec(model=fixture_set.model("dense")))
    message = str(caught.value)
    assert f"the external llama-server at {url} was not ready after 0.5s" in message
    assert "start it first, e.g. `llama-server --host 127.0.0.1" in message


@pytest.mark.parametrize("url", ["127.0.0.1:8080", "ftp://h:1", "http://h:1/v1/chat"])
def test_a_url_that_is_no_server_address_is_refused(url: str) -> None:
    with pytest.raises(ConfigError, match="is not a server address"):
        check_url(url)


MODULE = '''
from harness.client import ServerClient
from harness.planning.launch import LaunchSpec
from harness.runners.external_runner import ExternalServer


def test_attached(start_server, fixture_set):
    server = start_server(LaunchSpec(model=fixture_set.model("dense"), ctx_size=512))
    assert isinstance(server, ExternalServer)
    assert "external llama-server" in server.log_text()
    with ServerClient(server.base_url) as client:
        assert client.completion("Hello", n_predict=2).tokens_predicted == 2
'''


def test_the_plugin_option_attaches_tests_to_the_server(developers_server: SubprocessServer,
                                                        tmp_path: Path) -> None:
    (tmp_path / "test_attached.py").write_text(MODULE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["HARNESS_EXTERNAL_SERVER"] = developers_server.base_url
    done = subprocess.run([sys.executable, "-m", "pytest", "test_attached.py", "-q",
                           "-p", "no:xdist", "-p", "no:cacheprovider"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    assert developers_server.exit_code() is None
