"""An attached trace records what each server's ``GET /v1/models`` said (asked once at start; the
load's answer reused when gpuchef sends one), and `gpuchef report` fills the model and
max_model_len from it. The reference is the openai client's own ``models.list()`` of the same
`gpuchef serve`; a server without /v1/models, one that answers garbage, one that does not answer
and a hand-broken meta leave the fields "?" with one note, never a traceback."""

from __future__ import annotations

import html
import re
import socket

import pytest

from serve_proc import ServeProc
from test_attach import FakeServer, build

from gpuchef.probes.recorder import read_trace

openai = pytest.importorskip("openai")
pytest.importorskip("matplotlib")


def _page_text(paths) -> str:
    """The report page of ``paths`` as plain text (tags and figures dropped)."""
    from gpuchef.report.data import build as build_report
    from gpuchef.report.html import render

    page = render(build_report(list(paths), percentiles=(50.0, 99.0)))
    page = re.sub(r"<(svg|style|script).*?</\1>", " ", page, flags=re.S)
    page = re.sub(r"<img[^>]*>", " ", page)
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)))


def _run_rows(path) -> dict[str, str]:
    from gpuchef.report.data import build as build_report
    from gpuchef.report.html import _run_rows as rows

    return dict(rows(build_report([path], percentiles=(50.0, 99.0)).views[0]))


def _attach_and_close(url: str, trace, *extra: str):
    """`top --attach URL --trace FILE` built and closed at once (the meta is written at start)."""
    app = build(["--attach", url, "--scrape-hz", "10", "--trace", str(trace), *extra])
    app.session.close()
    return app.session


def test_attach_to_gpuchef_serve_records_its_models_and_the_report_fills_the_fields(tmp_path):
    trace = tmp_path / "a.jsonl"
    with ServeProc("--max-model-len", "512", "--served-model-name", "tiny-served") as srv:
        m = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0).models.list()
        ref = m.data[0]
        s = _attach_and_close(srv.url, trace)
    want = {"id": ref.id, "max_model_len": ref.max_model_len, "owned_by": ref.owned_by,
            "root": ref.root}
    assert want == {"id": "tiny-served", "max_model_len": 512, "owned_by": "gpuchef",
                    "root": "tiny"}
    meta = read_trace(trace).meta
    assert meta["server_models"] == {srv.url: want}
    assert meta["model"]["name"] == "tiny-served" and s.info.model == "tiny-served"
    rows = _run_rows(trace)
    assert rows["Model"] == "tiny-served (root tiny, owned_by gpuchef; GET /v1/models)"
    assert rows["KV cache"] == ("the server's (not seen from its client); max_model_len 512 "
                                "(GET /v1/models)")
    text = _page_text([trace])
    assert "?" not in text.split(" Summary ")[0], text[:300]  # the page's subtitle
    assert "a remote server" in text.split(" Summary ")[0]


def test_the_loads_models_answer_is_reused_not_asked_again(tmp_path):
    with FakeServer() as srv:
        app = build(["--attach", srv.url, "--scrape-hz", "10", "--dataset", "random",
                     "--num-prompts", "2", "--request-rate", "1", "--input-len", "8",
                     "--output-len", "2", "--trace", str(tmp_path / "l.jsonl")])
        s = app.session
        s.close()
        assert s.server_info[srv.url] is s.load.p.info
    meta = read_trace(tmp_path / "l.jsonl").meta
    assert meta["server_models"] == {srv.url: {"id": "fake", "max_model_len": 4096}}
    assert _run_rows(tmp_path / "l.jsonl")["Model"] == "fake"


@pytest.mark.parametrize("models,note", [
    (False, "GET /v1/models: HTTP 404"),
    ("garbage", "GET /v1/models: not an OpenAI model list (JSON with a 'data' list)"),
])
def test_a_server_without_a_model_list_leaves_the_fields_unknown_with_one_note(tmp_path,
                                                                               models, note):
    trace = tmp_path / "n.jsonl"
    with FakeServer(models=models) as srv:
        s = _attach_and_close(srv.url, trace)
        assert srv.model_gets == (0 if models is False else 1)  # asked once
    assert s.info.model == "(server's model)"
    meta = read_trace(trace).meta
    assert meta["server_models"] == {srv.url: {"note": note}}
    rows = _run_rows(trace)
    assert rows["Model"] == f"? — {note}"
    assert rows["KV cache"].endswith("max_model_len ? (GET /v1/models)")
    text = _page_text([trace])
    assert text.count(note) == 1  # one note; the subtitle names no note


def test_an_unreachable_server_is_a_note_and_the_session_still_starts(tmp_path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    s = _attach_and_close(url, tmp_path / "u.jsonl")
    note = read_trace(tmp_path / "u.jsonl").meta["server_models"][url]["note"]
    assert note.startswith("cannot connect"), note
    assert s.server_info[url].fatal


@pytest.mark.parametrize("bad", [
    {"http://h:1": "x"}, {"http://h:1": {"id": 7, "max_model_len": "big", "root": None}},
    "not a dict", {"http://h:1": {"id": "m", "max_model_len": True}},
])
def test_a_broken_server_models_meta_reads_as_unknown_never_a_traceback(tmp_path, bad):
    import json

    trace = tmp_path / "b.jsonl"
    with FakeServer() as srv:
        _attach_and_close(srv.url, trace)
    lines = trace.read_text().splitlines()
    meta = json.loads(lines[0])
    meta["server_models"] = bad
    lines[0] = json.dumps(meta)
    trace.write_text("\n".join(lines) + "\n")
    rows = _run_rows(trace)
    if isinstance(bad, dict) and isinstance(bad["http://h:1"], dict):
        assert rows["Model"].startswith("m" if bad["http://h:1"]["id"] == "m" else "fake")
        assert rows["KV cache"].endswith("max_model_len ? (GET /v1/models)")
    _page_text([trace])  # renders


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
