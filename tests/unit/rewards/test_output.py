"""Reward output is shown up to a cap per batch, cut at a line end, the rest counted."""

from __future__ import annotations

from temper.rewards.output import OutputCap


def test_the_first_lines_are_shown_and_the_rest_counted(capsys):
    cap = OutputCap(limit=20)
    cap.begin()
    cap.feed("stdout", b"line 1\nline 2\n")  # 14 bytes: shown
    cap.feed("stderr", b"err 3\nline 4\n")  # 6 more fit: "err 3\n" is shown, "line 4\n" not
    cap.feed("stdout", b"line 5\n")
    note = cap.end()
    out, err = capsys.readouterr()
    assert out == "line 1\nline 2\n"
    assert err == f"err 3\n{note}\n"
    assert note == (
        "reward output: 14 bytes more that reward functions printed in this batch of calls "
        "not shown (the first 20 bytes of each batch are)"
    )
    cap.begin()  # the next batch starts with the whole budget
    cap.feed("stdout", b"again\n")
    assert cap.end() is None
    assert capsys.readouterr().out == "again\n"


def test_a_line_longer_than_the_cap_is_cut_at_the_cap(capsys):
    cap = OutputCap(limit=4)
    cap.begin()
    cap.feed("stdout", b"abcdefgh")
    assert cap.end() is not None
    assert capsys.readouterr().out == "abcd"
