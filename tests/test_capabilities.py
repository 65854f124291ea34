"""Capabilities read from a real llama-server ``--help`` (captured from our CPU build)."""

from __future__ import annotations

from pathlib import Path

from harness.builds.capabilities import allowed_values, parse_capabilities, parse_options

HELP = (Path(__file__).parent / "data" / "help" / "llama-server-11434-cpu.txt").read_text()


def test_cache_types_are_read_for_k_and_v() -> None:
    caps = parse_capabilities(HELP)
    expected = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
    assert caps.cache_types_k == expected
    assert caps.cache_types_v == expected


def test_spec_types_come_from_the_option_argument() -> None:
    caps = parse_capabilities(HELP)
    assert caps.spec_types[0] == "none"
    assert {"draft-simple", "draft-mtp", "ngram-simple"} <= set(caps.spec_types)


def test_offload_and_fit_flags_are_known() -> None:
    caps = parse_capabilities(HELP)
    for flag in ("--n-cpu-moe", "--cpu-moe", "--n-cpu-ffn", "--fit", "--ctx-checkpoints",
                 "--spec-draft-model", "--spec-draft-n-max"):
        assert caps.accepts_flag(flag), flag
    assert not caps.accepts_flag("--no-such-flag")


def test_short_and_long_names_share_one_option() -> None:
    options = parse_options(HELP)
    assert options["-ctk"] is options["--cache-type-k"]
    assert options["--port"].argument == "PORT"
    assert "default: 8080" in options["--port"].description


def test_an_option_without_allowed_values_has_none() -> None:
    assert allowed_values(parse_options(HELP)["--port"]) == ()


def test_a_help_without_these_options_gives_empty_capabilities() -> None:
    caps = parse_capabilities("usage: something else\n-x, --example   does things\n")
    assert caps.cache_types_k == ()
    assert caps.spec_types == ()
    assert caps.flags == ("--example",)
