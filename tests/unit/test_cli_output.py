"""`send`'s streamed answer: to a terminal as it comes; elsewhere whole lines only,
each in one write, so that commands run at once never mix within a line."""

from __future__ import annotations

import pytest

from turnkeeper.cli.follow import _line, _StreamedText


def test_piped_output_is_written_in_whole_lines(capfd: pytest.CaptureFixture[str]) -> None:
    one, two = _StreamedText(live=False), _StreamedText(live=False)
    one.show(0, 1, "Hello, wor")
    two.show(0, 1, "Another ans")
    _line("  -> write_file started\n")
    one.show(0, 1, "Hello, world.\nSecond li")
    two.finish(0, "Another answer.")
    one.finish(0, "Hello, world.\nSecond line.")
    assert capfd.readouterr().out.splitlines() == [
        "  -> write_file started",
        "Hello, world.",
        "Another answer.",
        "Second line.",
    ]


def test_a_terminal_sees_the_text_as_it_grows(capfd: pytest.CaptureFixture[str]) -> None:
    live = _StreamedText(live=True)
    live.show(0, 1, "Hel")
    assert capfd.readouterr().out == "Hel"
    live.show(0, 1, "Hello")
    live.finish(0, "Hello.")
    assert capfd.readouterr().out == "lo.\n"
