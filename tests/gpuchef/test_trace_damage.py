"""Damaged traces, as a user's disk or a killed process leaves them, through `gpuchef report`
(each format) and `gpuchef replay`: a .jsonl.gz cut in the middle, a line of garbage, an empty
file, a trace from a future format version, a .gz cut before its first record. Either one
clear message naming the file and what is wrong (exit 2, no traceback), or the readable part
reported / replayed with a warning that names the file and the line."""

from __future__ import annotations

import asyncio
import gzip
import json
from io import StringIO

import pytest
from click.testing import CliRunner
from rich.console import Console

from gpuchef.commands.cli import _register, cli

_register()


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    p = tmp_path_factory.mktemp("damage") / "t.jsonl.gz"
    r = CliRunner().invoke(cli, ["bench", "--device", "cpu", "--model", "tiny", "--request-rate",
                                 "200", "--num-prompts", "32", "--input-len", "256",
                                 "--output-len", "24", "--sample-hz", "0", "--trace", str(p)])
    assert r.exit_code == 0, r.output
    return p


def damaged(good, tmp_path, kind):
    """(path, what a message about it must say, fatal?)"""
    raw = good.read_bytes()
    lines = gzip.decompress(raw).decode().splitlines(keepends=True)
    p = tmp_path / {"cut_gz": "cut.jsonl.gz", "cut_gz_head": "head.jsonl.gz"}.get(
        kind, f"{kind}.jsonl")
    if kind == "cut_gz":
        p.write_bytes(raw[: len(raw) // 2])
        return p, "the rest of the file is not read", False
    if kind == "cut_gz_head":
        p.write_bytes(raw[:30])
        return p, "cannot read", True
    if kind == "garbage":
        p.write_text("".join(lines[:5]) + "\x00\x01 garbage {{{\n" + "".join(lines[5:]))
        return p, "line 6: not valid JSON", False
    if kind == "empty":
        p.write_text("")
        return p, "empty file, not a gpuchef trace", True
    meta = json.loads(lines[0])
    meta["version"] = int(meta["version"]) + 1
    p.write_text(json.dumps(meta) + "\n" + "".join(lines[1:]))
    return p, f"trace format version {meta['version']} is newer than this gpuchef reads", True


KINDS = ["cut_gz", "cut_gz_head", "garbage", "empty", "future"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", ["html", "csv", "perfetto"])
def test_report_of_a_damaged_trace(good, tmp_path, kind, fmt):
    p, says, fatal = damaged(good, tmp_path, kind)
    out = tmp_path / "out" / "x"
    r = CliRunner().invoke(cli, ["report", str(p), "--format", fmt, "-o", str(out)])
    text = " ".join(r.output.split())
    assert "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert says in text and str(p) in text, r.output
    if fatal:
        assert r.exit_code == 2, r.output
        assert text.startswith(f"error: {p}:") and text.count("error:") == 1, r.output
        assert not list(tmp_path.glob("out/*"))  # nothing written
    else:
        assert r.exit_code == 0, r.output
        assert "warning:" in text and "wrote " in text


@pytest.mark.parametrize("kind", KINDS)
def test_replay_of_a_damaged_trace(good, tmp_path, kind):
    from gpuchef.commands.replay import build_app
    from gpuchef.tui.widgets.header import SessionHeader

    p, says, fatal = damaged(good, tmp_path, kind)
    if fatal:  # the command line: one message, exit 2, before any screen
        r = CliRunner().invoke(cli, ["replay", str(p)])
        text = " ".join(r.output.split())
        assert r.exit_code == 2 and "Traceback" not in r.output, r.output
        assert text.startswith(f"error: {p}:") and says in text, r.output
        return
    buf = StringIO()
    app = build_app(str(p), paused=True, err=Console(file=buf, width=400))
    assert says in buf.getvalue() and str(p) in buf.getvalue()
    notes = []
    real = app.notify
    app.notify = lambda m, *a, **k: (notes.append(str(m)), real(m, *a, **k))

    async def go():  # it opens, plays to the end and quits, with the warning on screen
        async with app.run_test(size=(160, 45)) as pilot:
            await pilot.press("end")
            await pilot.pause(0.3)
            assert app.session.position_ns == app.session.end_ns
            assert app.screen.query_one(SessionHeader)._state is not None
            await pilot.press("q")

    asyncio.run(go())
    assert any(says in n for n in notes), notes


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
