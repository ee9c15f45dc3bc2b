"""`gpuchef top` refuses bad flags before it loads a model, with the allowed range."""

from click.testing import CliRunner

from gpuchef.cli import _register, cli


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
    for args, msg in ((("--window", "5h"), "--window '5h' is not a duration"),
                      (("--window", "0.5s"), "allowed [1 s, 60 min]"),
                      (("--dataset", "random", "--request-rate", "inf"), "finite number of req/s"),
                      (("--fps", "100"), "allowed [1, 30]"),
                      (("--ab-window", "0.1"), "allowed [0.5, 3600] s"),
                      (("--goodput", "ttft"), "is not KEY:VALUE"),
                      (("--max-num-batched-tokens", "0"), "allowed [1, 1048576]"),
                      (("--sample-hz", "1000"), "allowed [1, 100] Hz"),
                      (("--screenshot-dir", "/nonexistent/shots"),
                       "--screenshot-dir '/nonexistent/shots' does not exist")):
        r = run("--device", "cpu", *args)
        assert r.exit_code == 2, (args, r.output)
        assert msg in " ".join(r.output.split()), (args, r.output)
