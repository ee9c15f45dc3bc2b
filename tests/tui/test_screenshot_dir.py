"""`--screenshot-dir` behaves as the output-file flags do (options.check_output_path makes their
missing parent folders): a folder that does not exist yet is created (with its parents, `~`
expanded) and `s` saves there; a file, or a path under a file, is one line and exit 2 before
any work. A new user's `--screenshot-dir shots/run1` was refused with 'does not exist'."""

from __future__ import annotations

import asyncio
from pathlib import Path

from click.testing import CliRunner
from tui_fakes import settle

from gpuchef.commands import top as top_cmd
from gpuchef.commands.cli import _register, cli
from gpuchef.commands.replay import build_app
from gpuchef.tui.app import GpuchefApp

_register()
# a real trace, shipped with the tests
TRACE = str(Path(__file__).parents[1] / "gpuchef" / "data" / "h200_chunked_1s.jsonl")


def run(*args):
    return CliRunner().invoke(cli, list(args))


def test_top_creates_a_missing_screenshot_folder_with_its_parents(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(GpuchefApp, "run", lambda app, *a, **k: seen.update(
        dir=app.screenshot_dir))
    monkeypatch.setattr(top_cmd, "stdout_is_terminal", lambda: True)  # CliRunner's is not one
    monkeypatch.setenv("HOME", str(tmp_path))
    r = run("top", "--device", "cpu", "--model", "tiny", "--sample-hz", "1",
            "--screenshot-dir", "~/shots/run1")
    assert r.exit_code == 0, r.output
    made = tmp_path / "shots" / "run1"
    assert made.is_dir()
    assert seen["dir"] == str(made)  # `~` expanded: the folder checked is the one `s` writes to


def test_replay_creates_the_folder_and_s_saves_an_svg_there(tmp_path):
    shots = tmp_path / "a" / "b"
    app = build_app(TRACE, paused=True, screenshot_dir=str(shots))
    assert shots.is_dir()

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            await pilot.press("s")
            for _ in range(50):
                if list(shots.glob("*.svg")):
                    break
                await pilot.pause(0.1)
            saved = list(shots.glob("*.svg"))
            assert len(saved) == 1 and saved[0].read_text().lstrip().startswith("<svg")
            await pilot.press("q")

    asyncio.run(go())


def test_a_file_or_a_path_under_a_file_is_one_line_and_exit_2(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    for cmd in (["top", "--device", "cpu", "--model", "tiny"], ["replay", TRACE]):
        for path, msg in ((f, f"--screenshot-dir {str(f)!r} is a file: give a folder"),
                          (f / "x" / "y", f"--screenshot-dir {str(f / 'x' / 'y')!r}: "
                                          f"{str(f)!r} is a file, not a folder")):
            r = run(*cmd, "--screenshot-dir", str(path))
            assert r.exit_code == 2, (cmd, path, r.output)
            assert msg in " ".join(r.output.split()), (cmd, r.output)
            assert "Traceback" not in r.output


def test_replay_of_a_bad_trace_makes_no_screenshot_folder(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("")
    r = run("replay", str(bad), "--screenshot-dir", str(tmp_path / "shots"))
    assert r.exit_code == 2, r.output
    assert not (tmp_path / "shots").exists()
