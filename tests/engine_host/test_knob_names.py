"""Knob names have one owner (engine_host/vocab/config.py: KNOBS and SETTINGS): the grammar takes every
spelling, and every surface that shows a knob reads its label from the table."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from dataclasses import fields, replace
from types import SimpleNamespace

import pytest

from gpuchef.engine_host.vocab import config as C
from gpuchef.engine_host.vocab.config import (AUTO_BUDGET, KNOBS, SETTINGS, SchedulerConfig,
                                              parse_settings, setting_name)
from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.vocab.records import EngineEvent

VALUE = {"mode": "continuous", AUTO_BUDGET: "itl_p99:50ms"}


def test_every_setting_has_its_names_and_they_do_not_clash():
    words: dict[str, str] = {}
    for name, spec in {**KNOBS, **SETTINGS}.items():
        assert spec.name == name and spec.short and spec.label
        assert spec.flag == "--" + name.replace("_", "-")  # vLLM's flag spelling of the field
        assert name in {f.name for f in fields(SchedulerConfig)}
        for w in (name, spec.short, *getattr(spec, "aliases", ())):
            assert words.setdefault(w, name) == name, f"{w!r} names {words[w]} and {name}"
    labels = [s.label for s in {**KNOBS, **SETTINGS}.values()]
    assert len(set(labels)) == len(labels)


def test_start_up_settings_are_flags_of_bench_and_serve_and_not_live_knobs():
    """startup_flags's flags are the ones the commands take (click's own parameter table), so
    "block_size is fixed at start-up (flag --block-size)" names a flag that exists."""
    from gpuchef.commands.bench import bench
    from gpuchef.commands.serve import serve

    flags = {o for cmd in (bench, serve) for p in cmd.params for o in p.opts}
    got = C.startup_flags()
    assert got["block_size"] == "--block-size"
    assert got["kv_cache_memory_gb"] == "--kv-cache-memory"
    assert not set(got) & ({*KNOBS, *SETTINGS})
    assert {f for f in got.values() if f not in flags} == set(), got


@pytest.mark.parametrize("name", [*KNOBS, *SETTINGS])
def test_grammar_takes_every_spelling(name):
    spec = KNOBS.get(name) or SETTINGS[name]
    want = C.parse_value(name, VALUE.get(name, "3"))
    spellings = {name, spec.short, spec.flag, spec.flag.lstrip("-"), name.upper(),
                 spec.short.replace("_", "-"), *getattr(spec, "aliases", ())}
    for word in spellings:
        assert setting_name(word) == name, word
        assert parse_settings(f"{word}={VALUE.get(name, '3')}") == {name: want}, word


def test_grammar_pairs_separators_and_the_autopilots_comma():
    got = parse_settings("chunked, budget = 512 seqs=8,auto=itl_p99:50ms,ttft_p99:2s long-partial=2")
    assert got == {"mode": "chunked", "max_num_batched_tokens": 512, "max_num_seqs": 8,
                   AUTO_BUDGET: "itl_p99:50ms,ttft_p99:2000ms", "max_long_partial_prefills": 2}
    assert parse_settings("") == {}


@pytest.mark.parametrize("text,needle", [
    ("block_size=32", "block_size is fixed at start-up (flag --block-size); live knobs are: mode, "
                      "max_num_batched_tokens (budget)"),
    ("--kv-cache-memory-gb=4", "kv_cache_memory_gb is fixed at start-up (flag --kv-cache-memory)"),
    ("budgets=3", "unknown knob 'budgets'"),
    ("budget", "'budget' is not KNOB=VALUE"),
    ("budget=1,max_num_batched_tokens=2", "max_num_batched_tokens is given twice"),
    ("seqs=lots", "max_num_seqs must be an integer in [1, 4096], got 'lots' (flag --max-num-seqs)"),
    ("budget=0", "max_num_batched_tokens=0 is out of range: allowed [1, 1048576] "
                 "(flag --max-num-batched-tokens)"),
    ("auto=itl_p99:0", "out of range"),
])
def test_grammar_refuses_with_a_message_naming_the_value(text, needle):
    with pytest.raises(ConfigError) as e:
        parse_settings(text)
    assert needle in str(e.value)


def test_palette_and_ab_share_the_grammar():
    from gpuchef.experiments.ab import parse_setting as ab_setting

    pytest.importorskip("textual")
    from gpuchef.tui.commands import parse_setting as palette_setting

    text = "budget=512, chunk=64 auto=itl_p99:50ms,ttft_p99:2s"
    assert palette_setting(text) == ab_setting(text, SchedulerConfig()).changes == \
        parse_settings(text)
    for bad in ("nope=1", "budget=0"):
        with pytest.raises(ConfigError) as pe:
            palette_setting(bad)
        with pytest.raises(ConfigError) as ae:
            ab_setting(bad, SchedulerConfig(), "B")
        assert str(ae.value) == f"--b {bad!r}: {pe.value}"


@pytest.fixture
def relabelled(monkeypatch):
    """KNOBS with max_num_seqs relabelled: a surface that shows the new label reads the table."""
    monkeypatch.setitem(KNOBS, "max_num_seqs",
                        replace(KNOBS["max_num_seqs"], label="SEQ-CAP-X"))
    monkeypatch.setitem(SETTINGS, AUTO_BUDGET, replace(SETTINGS[AUTO_BUDGET], label="AP-X"))
    return "SEQ-CAP-X"


def _event(name, old, new):
    return EngineEvent(kind="knob", step=0, t_ns=1, name=name, old=old, new=new)


def test_plotdata_event_labels_come_from_the_table(relabelled):
    from gpuchef.tui.plotdata import event_label

    assert event_label(_event("max_num_seqs", 256, 8)) == ("SEQ-CAP-X 256→8", "knob")
    assert event_label(_event(AUTO_BUDGET, "", "itl_p99:50ms"))[0].startswith("AP-X ")


def test_header_labels_come_from_the_table(relabelled):
    from gpuchef.tui.session import ABState, LoadState, SessionInfo
    from gpuchef.tui.widgets.header import HeaderState, header_text

    info = SessionInfo(model="tiny", random_weights=True, device="cpu", attention="reference")
    st = HeaderState(info, SchedulerConfig(max_num_seqs=7), LoadState("random", "random", 1.0),
                     0, None, "", ABState())
    assert "SEQ-CAP-X 7" in header_text(st).plain


def test_report_labels_come_from_the_table(relabelled):
    pytest.importorskip("matplotlib")
    from gpuchef.report import plots

    fig = plots._figure(6, 3)
    ax = fig.add_subplot()
    ax.set_xlim(0, 10)
    view = SimpleNamespace(t=lambda ns: ns / 1e9, ab=False, capacity=False, segments=[],
                           events=[_event("max_num_seqs", 256, 8),
                                   _event(AUTO_BUDGET, "", "itl_p99:50ms")])
    plots._events_overlay(ax, view, label=True)
    texts = [t.get_text() for t in ax.texts]
    assert "SEQ-CAP-X 256→8" in texts and "AP-X →itl_p99:50ms" in texts, texts


def test_controls_labels_come_from_the_table(relabelled):
    pytest.importorskip("textual")
    from textual.app import App
    from textual.widgets import Label

    from gpuchef.tui.widgets.controls import ControlsPanel

    class One(App):
        def compose(self):
            yield ControlsPanel(mode="chunked")

    async def run() -> list[str]:
        app = One()
        async with app.run_test():
            return [str(w.render()) for w in app.query(Label)]

    shown = asyncio.run(run())
    assert "SEQ-CAP-X" in shown and "AP-X" in shown
    assert KNOBS["max_num_batched_tokens"].label in shown


def test_ab_imports_without_textual():
    code = ("import sys; sys.modules['textual'] = None\n"
            "import gpuchef.experiments.ab, gpuchef.commands.ab\n"
            "from gpuchef.engine_host.vocab.config import SchedulerConfig\n"
            "s = gpuchef.experiments.ab.parse_setting('seqs=8,auto=itl_p99:50ms', SchedulerConfig())\n"
            "assert s.config.max_num_seqs == 8, s\n"
            "assert not any(m.startswith('gpuchef.tui') for m in sys.modules), "
            "sorted(m for m in sys.modules if m.startswith('gpuchef.tui'))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
