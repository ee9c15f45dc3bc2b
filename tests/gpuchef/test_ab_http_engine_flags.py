"""`gpuchef ab` over two servers and its flags (HD's report): the hosted engine's flags are refused
in one line that names the flag that named the servers (`--a url=/--b url=`, not a `--base-url`
that was never given) and every server; a bad load flag is one line in its own words, not
blamed on server A; the warning for flags a trace ignores comes once, not once per side."""

from __future__ import annotations

from test_ab_http import FAST, ab, fakes, one_error  # noqa: F401  (fakes: the fixture)


def test_engine_flag_with_two_servers_names_both_and_not_base_url(fakes):
    u1, u2 = fakes[0].url, fakes[1].url
    r = ab("--a", f"url={u1}", "--b", f"url={u2}", "--decode-attention", "xqa", *FAST)
    one_error(r, "--decode-attention does not apply with --a url=/--b url=",
              f"the servers at {u1} and {u2} run their own engines")
    assert "--base-url" not in r.output, r.output


def test_engine_flag_with_one_server_keeps_base_url_wording(fakes):
    u = fakes[0].url
    r = ab("--base-url", u, "--a", "budget=16", "--b", "budget=32", "--device", "cpu",
           "--decode-attention", "xqa", *FAST)
    one_error(r, "--device, --decode-attention do not apply with --base-url",
              f"the server at {u} runs its own engine")


def test_a_load_flag_error_names_no_side(fakes, tmp_path):
    """A bad load flag or --result-json path is both sides': its own words, no `--a url=U:` in
    front (which read as server A's fault); a server's own fault still names its side. (A
    missing folder is created, options.check_output_path; one under a file is refused.)"""
    u1, u2 = fakes[0].url, fakes[1].url
    two = ("--a", f"url={u1}", "--b", f"url={u2}")
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    bad = str(blocker / "x.json")
    cases = [(["--input-len", "0"], "error: --input-len=0 is out of range"),
             (["--result-json", bad],
              f"error: --result-json {bad!r}: {str(blocker)!r} is a file, not a folder")]
    for extra, words in cases:
        i = FAST.index("--input-len")
        fast = FAST[:i] + FAST[i + 2:] if "--input-len" in extra else FAST
        r = ab(*two, *fast, *extra)
        one_error(r, words)
        assert "url=" not in r.output, r.output


def test_the_trace_ignores_flags_warning_comes_once(fakes):
    u1, u2 = fakes[0].url, fakes[1].url
    r = ab("--a", f"url={u1}", "--b", f"url={u2}", "--dataset", "azure-conv", "--num-prompts",
           "2", "--trace-speed", "inf", "--max-input-len", "8", "--max-output-len", "2",
           "--input-len", "5", "--vocab-size", "100")
    assert r.exit_code == 0, r.output
    warned = [x for x in r.output.splitlines() if x.startswith("warning: --input-len")]
    assert len(warned) == 1, r.output
