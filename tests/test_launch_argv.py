"""The launch argv: every field's flag, the round trip, and the built server's --help."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.builds.capabilities import parse_options
from harness.facts.gpu import SETTINGS_BY_NAME
from harness.planning.launch import LaunchSpec, emitted_flags

FULL = LaunchSpec(
    model=Path("/m/model.gguf"), ctx_size=4096, parallel=2, batch_size=2048, ubatch_size=512,
    cache_type_k="q8_0", cache_type_v="q4_0", flash_attn="on", n_gpu_layers=99, fit="off",
    ctx_checkpoints=8, spec_type="draft-simple", drafter=Path("/m/drafter.gguf"),
    spec_draft_n_min=2, spec_draft_n_max=8, n_cpu_moe=3, cpu_moe=True, n_cpu_ffn=1,
    kv_offload=False, threads=2, metrics=True,
)


def test_every_field_reaches_the_argv() -> None:
    argv = FULL.to_argv("llama-server", "127.0.0.1", 0)
    pairs = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert argv[:5] == ["llama-server", "--host", "127.0.0.1", "--port", "0"]
    assert argv[5:7] == ["--model", "/m/model.gguf"]
    assert pairs["--ctx-size"] == "4096"
    for switch in ("--cpu-moe", "--no-kv-offload", "--metrics"):
        assert switch in argv


def test_every_tuned_setting_is_a_launch_field() -> None:
    launch_fields = {f.name for f in dataclasses.fields(LaunchSpec)}
    assert set(SETTINGS_BY_NAME) <= launch_fields


def test_settings_round_trip_through_the_spec() -> None:
    tuned: dict[str, Any] = FULL.settings().as_dict()
    expected = dataclasses.replace(LaunchSpec(model=FULL.model), **tuned)
    assert LaunchSpec.from_settings(FULL.model, FULL.settings()) == expected
    assert tuned["flash_attn"] == "on"


def test_unset_fields_leave_the_server_defaults() -> None:
    argv = LaunchSpec(model=Path("m.gguf")).to_argv("s", "h", 1)
    assert argv == ["s", "--host", "h", "--port", "1", "--model", "m.gguf",
                    "--log-verbosity", "4"]


def test_full_spec_round_trips() -> None:
    assert LaunchSpec.from_argv(FULL.to_argv("s", "h", 0)) == FULL


optional_ints = st.none() | st.integers(min_value=0, max_value=1 << 20)
specs = st.builds(
    LaunchSpec,
    model=st.just(Path("/m/x.gguf")),
    ctx_size=optional_ints, parallel=optional_ints, batch_size=optional_ints,
    ubatch_size=optional_ints,
    cache_type_k=st.none() | st.sampled_from(["f16", "q8_0", "q4_0", "qjl1_256"]),
    cache_type_v=st.none() | st.sampled_from(["f16", "q8_0", "q4_0", "q4_polar"]),
    flash_attn=st.none() | st.sampled_from(["on", "off", "auto"]),
    n_gpu_layers=optional_ints, n_cpu_moe=optional_ints, n_cpu_ffn=optional_ints,
    cpu_moe=st.booleans(), kv_offload=st.none() | st.booleans(),
    spec_draft_p_min=st.none() | st.floats(min_value=0, max_value=1),
    spec_type=st.none() | st.sampled_from(["draft-simple", "draft-mtp"]),
    drafter=st.none() | st.just(Path("/m/d.gguf")),
)


@given(specs)
def test_any_spec_round_trips(spec: LaunchSpec) -> None:
    assert LaunchSpec.from_argv(spec.to_argv("s", "127.0.0.1", 0)) == spec


@pytest.mark.server
def test_every_flag_the_planner_emits_is_known_to_the_build(llama_server_binary: Path) -> None:
    help_text = subprocess.run([str(llama_server_binary), "--help"], capture_output=True,
                               text=True, timeout=60, check=True).stdout
    known = parse_options(help_text)
    unknown = [flag for flag in emitted_flags() if flag not in known]
    assert not unknown, f"{llama_server_binary} does not know {unknown}; the planner emits them"
