"""``fpm-planner replay`` refuses output paths it cannot write before the run (no traceback, exit 2, nothing
replayed), and its ``--help`` shows every default."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.cli import main

FAST = ["replay", "--scenario", "surge_from_idle", "--policy", "fixed", "--duration-s", "30", "--quiet"]


@pytest.mark.parametrize("flag", ["--json", "--decisions-jsonl"])
def test_an_output_file_path_that_is_a_directory_is_refused_before_the_run(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*FAST, flag, str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert f"{flag} {tmp_path}: is a directory" in err and "Traceback" not in err
    assert "attainment" not in out  # nothing ran


@pytest.mark.parametrize("flag", ["--json", "--decisions-jsonl"])
def test_an_output_file_path_under_a_file_is_refused_before_the_run(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert main([*FAST, flag, str(blocker / "out.json")]) == 2
    out, err = capsys.readouterr()
    assert f"{flag}: cannot create directory" in err and "attainment" not in out


def test_a_report_path_that_is_a_file_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "report.html"
    blocker.write_text("x")
    assert main([*FAST, "--report", str(blocker)]) == 2
    out, err = capsys.readouterr()
    assert "exists and is not a directory" in err and "attainment" not in out


def test_help_shows_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["replay", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for shown in ("(default: 1.0)", "(default: 2000.0)", "(default: 50.0)", "(default: 256)", "(default: cold)"):
        assert shown in text, shown
