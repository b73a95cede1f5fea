"""response_format json_object (JSON mode) end to end: the reply is constrained to one JSON object
(text/json_constraint.h); what cannot be enforced is refused. stories260K writes long strings, so a small bias
towards closing tokens ('"' = 313 after a space, '}' = 128) lets its replies finish within the context."""
import json

import openai
import pytest
import requests

from conftest import run_server
from test_openai_api import MODEL

JSON_MODE = {"type": "json_object"}
CLOSERS = {"313": 12, "128": 12}


def test_completions_replies_are_json_objects(client):
    ended = 0
    for seed in range(8):
        r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=100, temperature=0.8,
                                      seed=seed, logit_bias=CLOSERS, extra_body={"response_format": JSON_MODE})
        text = r.choices[0].text
        assert text.lstrip().startswith("{"), text
        if r.choices[0].finish_reason == "stop":  # ended by EOS: only allowed once the object is complete
            assert isinstance(json.loads(text), dict), text
            ended += 1
        else:
            assert r.choices[0].finish_reason == "length"
    assert ended >= 3


def test_chat_streamed_reply_is_a_json_object(client):
    msgs = [{"role": "user", "content": "Answer in JSON"}]
    kw = dict(model=MODEL, messages=msgs, max_tokens=60, temperature=0, logit_bias=CLOSERS, response_format=JSON_MODE)
    whole = client.chat.completions.create(**kw).choices[0]
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw)
                       if c.choices)
    assert streamed == whole.message.content
    assert whole.finish_reason == "stop" and isinstance(json.loads(whole.message.content), dict)


@pytest.mark.parametrize("extra,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string",
                                                                                         "minLength": 2}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ({"response_format": JSON_MODE, "ignore_eos": True}, "ignore_eos"),
])
def test_what_cannot_be_enforced_is_refused(stories_server, extra, param):
    body = {"model": MODEL, "prompt": "x", "max_tokens": 4, **extra}
    r = requests.post(stories_server.url + "/v1/completions", json=body, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_json_mode_needs_a_tokenizer(tmp_path):
    with run_server(tmp_path, model="dummy:tiny") as s:
        r = requests.post(s.url + "/v1/completions", json={"model": "dummy:tiny", "prompt": [1, 2], "max_tokens": 2,
                                                           "response_format": JSON_MODE}, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text


def test_json_schema_replies_follow_the_schema(client):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                               "pet": {"enum": ["cat", "dog"]}},
              "required": ["name", "age", "pet"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}
    ended = 0
    for seed in range(6):
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Who?"}],
                                           max_tokens=80, temperature=0.8, seed=seed, logit_bias=CLOSERS,
                                           response_format=fmt)
        text = r.choices[0].message.content
        assert text.lstrip('{ \n').startswith('"name"'), text  # the schema's first property, its exact key
        if r.choices[0].finish_reason == "stop":
            v = json.loads(text)
            assert list(v) == ["name", "age", "pet"] and isinstance(v["name"], str), text
            assert isinstance(v["age"], int) and v["pet"] in ("cat", "dog"), text
            ended += 1
    assert ended >= 2
