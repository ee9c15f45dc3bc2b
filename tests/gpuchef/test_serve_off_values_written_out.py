"""`gpuchef serve` takes the "off" values as clients that write out every field send them
(HD's report): `n` 1.0 (as `max_tokens` 4.0 and `best_of` 1.0 already were) and
`response_format` `{"type": "text"}` with its other keys null (a client's pydantic model dumped
without exclude_none); anything else stays a 400 naming the field.

The server is test_serve's module fixture (a `gpuchef serve` subprocess, tiny, CPU).
"""

from __future__ import annotations

import pytest

from test_serve import client, http, server  # noqa: F401  (server: the fixture)

openai = pytest.importorskip("openai")

CHAT = [{"role": "user", "content": "hi"}]


def test_n_as_an_integral_float_is_one_choice_and_two_is_still_refused(server):
    st, body = http("POST", server.url + "/v1/completions",
                    {"prompt": "x", "max_tokens": 2, "n": 1.0, "ignore_eos": True})
    assert st == 200, body
    assert len(body["choices"]) == 1 and body["usage"]["completion_tokens"] == 2
    for n in (2.0, 1.5, True):
        st, body = http("POST", server.url + "/v1/completions",
                        {"prompt": "x", "max_tokens": 2, "n": n})
        assert st == 400 and body["error"]["param"] == "n", (n, body)
        assert "allowed n=1" in body["error"]["message"]


def test_response_format_text_with_null_keys_is_off(server):
    c = client(server)
    r = c.chat.completions.create(model="tiny-served", messages=CHAT, max_tokens=3,
                                  response_format={"type": "text", "json_schema": None},
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3
    for rf in ({"type": "json_object", "json_schema": None},
               {"type": "text", "json_schema": {"name": "x", "schema": {}}}):
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="tiny-served", messages=CHAT, max_tokens=3,
                                      response_format=rf)
        assert e.value.body["param"] == "response_format", e.value.body
        assert "is not supported by gpuchef serve" in e.value.body["message"]


#: each test starts the engine's process (seconds on 2 cores): the full run only
pytestmark = pytest.mark.slow
