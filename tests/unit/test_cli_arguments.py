"""Bad arguments are refused as bad usage (exit 2) in words, before anything is
sent: no message goes out that `send` then waits for in vain, and no traceback."""

from __future__ import annotations

import pytest

from turnkeeper import cli


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["send", "c", "hi", "--message-id", ""], "a message id is 1-200 characters, got 0"),
        (["send", "c", "hi", "--message-id", "m" * 201], "a message id is 1-200 characters, got 201"),
        (
            ["send", "c", "hi", "--message-id", "\udcfe"],
            "the message id is not valid Unicode (a lone surrogate at character 1)",
        ),
        (["send", "c", ""], "a message needs text"),
        (["send", "c", " \n"], "a message needs text"),
        (["send", "c", "ok \udcff"], "not UTF-8 text (at character 4)"),  # argv's bytes that are not UTF-8
        (["send", "c", "hi", "--timeout", "0"], "must be a number of seconds above 0, got '0'"),
        (["send", "c", "hi", "--timeout", "-1"], "must be a number of seconds above 0"),
        (["send", "c", "hi", "--timeout", "nan"], "must be a number of seconds above 0"),
        (["send", "c", "hi", "--timeout", "inf"], "must be a number of seconds above 0"),
        (["continue", "c", "--wait", "--timeout", "soon"], "must be a number of seconds above 0"),
    ],
)
def test_refused_as_bad_usage_in_words(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.run(argv)
    assert exit_.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["send", "c", "hi", "--message-id", "m" * 200, "--timeout", "0.5"],
        ["send", "c", "é ✓ 😀", "--message-id", "é"],
        ["continue", "c", "--wait", "--timeout", "30"],
    ],
)
def test_good_ones_parse(argv: list[str]) -> None:
    args = cli.build_parser().parse_args(argv)
    assert args.chat == "c"


def test_version_and_the_server_commands_options(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    from turnkeeper.cli import build_parser

    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"turnkeeper {version('turnkeeper')}\n"
    for command, variables in (
        ("worker", ("TEMPORAL_ADDRESS", "TURNKEEPER_TASK_QUEUE", "TURNKEEPER_MODEL")),
        ("web", ("TURNKEEPER_WEB_ADDRESS", "TURNKEEPER_WEB_TOKEN", "TEMPORAL_ADDRESS")),
        ("codec-server", ("TURNKEEPER_CODEC_ADDRESS", "TURNKEEPER_ENCRYPTION_KEYS")),
    ):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        shown = capsys.readouterr().out
        assert "Configured by environment variables" in shown
        assert all(v in shown for v in variables), (command, shown)
