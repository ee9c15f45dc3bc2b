"""--help's conditions name flags the command has: an option whose help starts "With --X"
(the flag that turns it on) must be one that `gpuchef CMD` accepts. `top --help` said "With
--base-url or --attach" (top has no --base-url) and `bench --help` / `ab --help` the same
(neither has --attach)."""

import re

import pytest
from click.testing import CliRunner

from gpuchef.commands.cli import _register, cli

_register()

#: "With --attach:", "With --base-url (ab: or --a/--b url=URL):", "With --base-url or --attach,"
_CONDITION = re.compile(r"^With ((?:--[a-z][a-z0-9-]*(?:\s*\(.*?\))?(?: or )?)+)")


def _flags(cmd) -> set[str]:
    return {o for p in cmd.params
            for o in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ()))}


@pytest.mark.parametrize("name", sorted(cli.commands))
def test_with_flag_conditions_name_flags_of_the_command(name):
    cmd = cli.commands[name]
    flags = _flags(cmd)
    checked = 0
    for p in cmd.params:
        m = _CONDITION.match(getattr(p, "help", None) or "")
        if not m:
            continue
        named = re.findall(r"--[a-z][a-z0-9-]*", re.sub(r"\(.*?\)", "", m.group(1)))
        checked += 1
        missing = [f for f in named if f not in flags]
        assert not missing, (f"gpuchef {name} {p.opts[0]}: its help names {missing}, "
                             f"not a flag of {name}")
    if name in ("bench", "ab", "top"):
        assert checked >= 5  # the HTTP client's flags are there and were checked


@pytest.mark.parametrize("name,via", [("top", "--attach"), ("bench", "--base-url")])
def test_help_text_as_printed(name, via):
    out = CliRunner().invoke(cli, [name, "--help"], terminal_width=100).output
    assert re.search(rf"--max-concurrency INTEGER\s+With {via}", out), out


def _help_rates(text: str) -> tuple[float, float]:
    m = re.search(r"top sends its load live and refuses inf: there the default is ([\d.]+) req/s "
                  r"on a CPU, ([\d.]+) on a GPU or with --attach", " ".join(text.split()))
    assert m, text
    return float(m.group(1)), float(m.group(2))


def test_top_request_rate_default_is_the_one_top_uses():
    """`top --help` said `--request-rate [default: inf]`, but top refuses inf and sends 2 req/s
    on a CPU, 10 on a GPU and with --attach (top_cmd's defaults)."""
    from gpuchef.commands import top as top_cmd

    out = CliRunner().invoke(cli, ["top", "--help"], terminal_width=100).output
    block = out[out.index("--request-rate"):out.index("--burstiness")]
    assert "[default: inf]" not in block
    assert _help_rates(block) == (top_cmd.CPU_RANDOM_RATE, top_cmd.GPU_RANDOM_RATE)


def test_top_attach_sends_the_rate_its_help_names(monkeypatch):
    """Through the command: top --attach with --dataset random and no rate prints its load
    line with the rate once every check has passed (the session itself is replaced here by
    one that stops the command); with --ab-load and one --attach it stops with one error line
    before announcing any load."""
    import gpuchef.sessions.attach as attach_mod
    from gpuchef.engine_host.vocab.errors import ConfigError

    def no_session(*a, **kw):
        raise ConfigError("stopped by the test")
    monkeypatch.setattr(attach_mod, "AttachSession", no_session)
    from gpuchef.commands import top as top_cmd
    monkeypatch.setattr(top_cmd, "stdout_is_terminal", lambda: True)  # CliRunner's is not one
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Models(BaseHTTPRequestHandler):  # just GET /v1/models: top's look-up before it starts
        def do_GET(self):
            if self.path.rstrip("/") == "/v1/models":
                body = json.dumps({"object": "list", "data": [
                    {"id": "m", "object": "model", "max_model_len": 4096, "vocab_size": 4096}]})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
            else:
                body = "{}"
                self.send_response(404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        help_text = CliRunner().invoke(cli, ["top", "--help"], terminal_width=100).output
        _, attach_rate = _help_rates(help_text)
        url = f"http://127.0.0.1:{srv.server_port}"
        r = CliRunner().invoke(cli, ["top", "--attach", url, "--dataset", "random",
                                     "--num-prompts", "5"])
        refused = CliRunner().invoke(cli, ["top", "--attach", url, "--dataset", "random",
                                           "--num-prompts", "5", "--ab-load", "mirrored"])
    finally:
        srv.shutdown()
        srv.server_close()
    assert r.exit_code == 2 and "stopped by the test" in r.output, r.output
    m = re.search(r"\(random, ([\d.]+) req/s", r.output)
    assert m, r.output
    assert float(m.group(1)) == attach_rate
    # attach.md: one error line before anything starts, no load announced
    assert refused.exit_code == 2 and "requests to" not in refused.output, refused.output
    assert "--ab-load runs an A/B of two attached servers" in refused.output


@pytest.mark.slow  # starts the engine's process per case
@pytest.mark.parametrize("flag", ["--num-gpu-blocks", "--num-gpu-blocks-override"])
def test_vllm_spelling_of_the_kv_block_count_sizes_the_cache(tmp_path, flag):
    """vLLM's --num-gpu-blocks-override is accepted as gpuchef's --num-gpu-blocks: the KV cache
    the engine ran with (the result JSON's config) has the blocks given."""
    import json

    out = tmp_path / "r.json"
    r = CliRunner().invoke(cli, ["bench", "--device", "cpu", "--model", "tiny", "--num-prompts",
                                 "2", "--input-len", "8", "--output-len", "2", "--sample-hz", "0",
                                 flag, "600", "--result-json", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["config"]["kv_blocks"] == 600
