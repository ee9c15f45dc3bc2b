"""The command palette's typed commands: `parse_ab`'s window forms, and which hits a query gets
(a typed command that parses is shown alone; one that does not parse shows its error and the
look-alike actions too, so "ab screen" still finds "Show A/B screen")."""

import asyncio

import pytest
from tui_fakes import StaticSession, settle

from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.tui.app import GpuchefApp
from gpuchef.tui.commands import DashboardCommands, parse_ab


@pytest.mark.parametrize("text,window,a,b", [
    ("budget=512 vs budget=2048 window=20", 20.0, 512, 2048),
    ("budget=512 vs budget=2048 window=20s", 20.0, 512, 2048),
    ("budget=512 vs budget=2048 window=20 s", 20.0, 512, 2048),
    ("budget=512 vs budget=2048 window = 20", 20.0, 512, 2048),
    ("window=20,budget=512 vs budget=2048", 20.0, 512, 2048),
    ("budget=512 vs budget=2048 window=2e1", 20.0, 512, 2048),
    ("budget=512 vs budget=2048", None, 512, 2048),
])
def test_parse_ab_window_forms(text, window, a, b):
    sa, sb, w = parse_ab(text)
    assert w == window
    assert sa == {"max_num_batched_tokens": a} and sb == {"max_num_batched_tokens": b}


@pytest.mark.parametrize("text,msg", [
    ("budget=512 vs budget=2048 window=", "A/B window '' is not a number of seconds"),
    ("budget=512 vs budget=2048 window=abc", "A/B window 'abc' is not a number of seconds"),
    ("budget=512 vs budget=2048 window=nan", "A/B window 'nan' is not a number of seconds"),
    ("budget=512 window=10 vs budget=2048 window=30", "window is given twice"),
])
def test_parse_ab_bad_windows_name_the_value(text, msg):
    with pytest.raises(ConfigError, match=msg):
        parse_ab(text)


def hits_for(queries):
    app = GpuchefApp(StaticSession(gpu=True), show_ui_cost=False)
    out = {}

    async def go():
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot)
            provider = DashboardCommands(app.screen)
            for q in queries:
                out[q] = [str(h.match_display) async for h in provider.search(q)]

    asyncio.run(go())
    return out


def test_typed_commands_and_look_alikes():
    got = hits_for(["ab screen", "mode c", "window 5", "window 0", "budget 512",
                    "ab mode=chunked vs mode=continuous"])
    # did not parse: the error first... and the actions that match still offered
    assert any("Show A/B screen" in t for t in got["ab screen"]), got["ab screen"]
    assert any("Switch mode to continuous" in t for t in got["mode c"]), got["mode c"]
    assert any("⚠" in t for t in got["mode c"])
    # parsed (or a window out of range): the typed command alone
    assert got["window 5"] == ["Waveform window 5 s"]
    assert got["window 0"] == ["⚠ waveform window 0 s is out of range: allowed [1, 3600] s"]
    assert got["budget 512"] == ["Set max_num_batched_tokens = 512"]
    assert len(got["ab mode=chunked vs mode=continuous"]) == 1
    assert got["ab mode=chunked vs mode=continuous"][0].startswith("Start A/B: ")


def test_rate_field_marks_what_the_load_accepts():
    """The controls' red mark and the load's refusal come from one parse_rate: '2x' and '×2' are
    trace speeds, '1e9' is over the maximum, 'abc' is not a number."""
    from gpuchef.tui.widgets.controls import RateValidator

    class Panel:
        _rate_unit = "×"

    v = RateValidator(Panel())
    assert v.validate("2x").is_valid and v.validate("×2").is_valid and v.validate("0.5").is_valid
    bad = v.validate("1e9")
    assert not bad.is_valid and "allowed (0, 10000]" in bad.failure_descriptions[0]
    assert not v.validate("abc").is_valid and not v.validate("0").is_valid
