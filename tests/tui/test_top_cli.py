"""`gpuchef top` refuses bad flags before it loads a model, with the allowed range, and a stdout
that is not a terminal (`top > file` drew into the file and burned a core) before it builds
anything."""

import pytest
from click.testing import CliRunner

from gpuchef.commands import top as top_cmd
from gpuchef.commands.cli import _register, cli


def run(*args):
    _register()
    return CliRunner().invoke(cli, ["top", *args])


def test_help_lists_the_dashboard_flags():
    r = run("--help")
    assert r.exit_code == 0
    for flag in ("--sample-hz", "--gpus", "--window", "--trace", "--ab-window", "--goodput",
                 "--max-num-batched-tokens", "--long-prefill-token-threshold"):
        assert flag in r.output


def test_bad_flags_are_refused_with_the_range():
    for args, msg in ((("--window", "5h"), "--window '5h' is out of range: allowed [1 s, 60 min]"),
                      (("--window", "5x"), "--window '5x' is not a duration"),
                      (("--window", "0.5s"), "allowed [1 s, 60 min]"),
                      (("--dataset", "random", "--request-rate", "inf"), "finite number of req/s"),
                      (("--fps", "100"), "allowed [1, 30]"),
                      (("--ab-window", "0.1"), "allowed [0.5, 3600] s"),
                      (("--goodput", "ttft"), "is not KEY:VALUE"),
                      (("--max-num-batched-tokens", "0"), "allowed [1, 1048576]"),
                      (("--sample-hz", "1000"), "allowed [1, 100] Hz")):
        r = run("--device", "cpu", *args)
        assert r.exit_code == 2, (args, r.output)
        assert msg in " ".join(r.output.split()), (args, r.output)


def test_header_shows_only_the_live_budget_after_a_change(monkeypatch, tmp_path):
    """On CPU `top` lowers the budget to 512 and said so in the header's second line ("budget
    512"), which stayed after the budget changed. The header names one budget: the live one."""
    from gpuchef.tui.app import GpuchefApp
    from gpuchef.tui.screens.main import header_state
    from gpuchef.tui.widgets.header import header_text
    from gpuchef.commands.top import CPU_BUDGET

    seen = {}

    def fake_run(app, *a, **k):  # instead of the terminal: what the header would show
        st = header_state(app)
        live = st.config.with_changes(max_num_batched_tokens=CPU_BUDGET * 4)
        from dataclasses import replace
        seen["before"] = header_text(st).plain
        seen["after"] = header_text(replace(st, config=live)).plain

    monkeypatch.setattr(GpuchefApp, "run", fake_run)
    monkeypatch.setattr(top_cmd, "stdout_is_terminal", lambda: True)  # CliRunner's is not one
    r = run("--device", "cpu", "--model", "tiny", "--sample-hz", "1",
            "--screenshot-dir", str(tmp_path))
    assert r.exit_code == 0, r.output
    assert f"budget {CPU_BUDGET}" in seen["before"]
    assert f"budget {CPU_BUDGET * 4}" in seen["after"]
    assert f"{CPU_BUDGET}" not in seen["after"].replace(f"{CPU_BUDGET * 4}", ""), seen["after"]
    assert "CPU default" in seen["after"]  # it still says the budget started as a CPU default


@pytest.mark.parametrize("args", [
    ("--device", "cpu", "--model", "tiny"),
    ("--device", "cpu", "--model", "tiny", "--serve", "--port", "0"),
    ("--attach", "http://127.0.0.1:9"),
], ids=["hosted", "serve", "attach"])
def test_stdout_not_a_terminal_is_refused_before_anything_is_built(monkeypatch, args):
    """CliRunner's stdout is not a terminal, as `gpuchef top > file`'s: one error line naming
    the problem and the headless commands, exit 2, no engine, HTTP server or scrape started."""
    import gpuchef.sessions.attach
    import gpuchef.sessions.headless

    built = []

    def no(what):
        def f(*a, **k):
            built.append(what)
            raise AssertionError(f"{what} started")
        return f

    monkeypatch.setattr(gpuchef.sessions.headless, "build_engine", no("engine"))
    monkeypatch.setattr(top_cmd, "prepare_serving", no("HTTP server"))
    monkeypatch.setattr(gpuchef.sessions.attach, "AttachSession", no("attach session"))
    r = run(*args)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2, r.output
    assert lines == [f"error: {top_cmd.NOT_A_TERMINAL}"], r.output
    assert "needs a terminal" in lines[0] and "gpuchef bench" in lines[0] \
        and "gpuchef serve" in lines[0]
    assert built == []


def test_a_bad_flag_is_named_even_without_a_terminal():
    """The flags are checked first: a bad one is what the user hears about, terminal or not."""
    r = run("--device", "cpu", "--fps", "100")
    assert r.exit_code == 2 and "allowed [1, 30]" in r.output
    assert "needs a terminal" not in r.output
