"""`gpuchef ab` over HTTP refuses the hosted engine's flags in one line that names the flag that
named the servers (`--a url=/--b url=`, not a `--base-url` that was never given) and every
server, as a tester found with `--decode-attention` (HD's report)."""

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
