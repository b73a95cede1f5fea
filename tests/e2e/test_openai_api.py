"""The OpenAI-compatible API of `inferx serve`, driven by the real openai client (tests/requirements.txt)."""
import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import requests

from conftest import TESTDATA

MODEL = "stories260K"
PROMPT = "Once upon a time"


def sse_events(resp):
    """The data payloads of a streamed response, in order (raw, to check framing and [DONE])."""
    events = []
    for line in resp.iter_lines(decode_unicode=True):
        if line.startswith("data: "):
            events.append(line[len("data: "):])
        else:
            assert line == "", f"unexpected SSE line {line!r}"
    return events


def test_health_ready_version_models(stories_server):
    url = stories_server.url
    assert requests.get(url + "/health", timeout=5).json() == {"status": "ok"}
    assert requests.get(url + "/ready", timeout=5).status_code == 200
    assert "version" in requests.get(url + "/version", timeout=5).json()
    models = requests.get(url + "/v1/models", timeout=5).json()
    assert models["object"] == "list" and models["data"][0]["id"] == MODEL
    assert requests.get(url + "/nope", timeout=5).status_code == 404


def test_completion_matches_llama2c_greedy(client):
    # Independent reference: llama2.c run.c greedy output for the same model and prompt.
    ref = json.loads((TESTDATA / "stories260K.greedy.json").read_text())["cases"][1]
    assert ref["prompt"] == PROMPT
    out_ids = ref["output_ids"][:100]  # the model's context is 128 tokens
    r = client.completions.create(model=MODEL, prompt=ref["input_ids"], max_tokens=len(out_ids), temperature=0)
    assert r.id.startswith("cmpl-") and r.object == "text_completion" and r.model == MODEL
    assert r.usage.prompt_tokens == len(ref["input_ids"])
    assert r.usage.completion_tokens == len(out_ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.choices[0].finish_reason == "length"
    assert len(r.choices[0].text) > 200 and ref["text"][len(PROMPT):].startswith(r.choices[0].text)


def test_chat_completion(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Tell me a story"}],
                                       max_tokens=16, temperature=0)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"
    m = r.choices[0].message
    assert m.role == "assistant" and m.content
    assert r.usage.completion_tokens == 16 and r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens > 10  # the ChatML template wrapped the message


def test_stream_completion_same_text_as_non_stream(client):
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert all(c.object == "text_completion" and c.id == chunks[0].id for c in chunks)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20


def test_stream_chat_chunk_sequence_like_openai(stories_server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    with requests.post(stories_server.url + "/v1/chat/completions", json=body, stream=True, timeout=30) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = sse_events(resp)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    # role chunk, content deltas, a finish chunk with an empty delta, then the usage chunk.
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = chunks[1:-2]
    assert content and all(set(c["choices"][0]["delta"]) == {"content"} for c in content)
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-2])
    assert chunks[-2]["choices"][0]["delta"] == {} and chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8


def test_stream_without_usage_has_no_usage_field(stories_server):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 3, "stream": True}
    with requests.post(stories_server.url + "/v1/completions", json=body, stream=True, timeout=30) as resp:
        events = sse_events(resp)
    assert events[-1] == "[DONE]"
    assert all("usage" not in json.loads(e) for e in events[:-1])


def test_n_greater_than_one(client):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, n=3, temperature=1.0, seed=7)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens == 36
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, n=2, temperature=1.0,
                                            stream=True))
    assert {c.choices[0].index for c in chunks} == {0, 1}


def test_stop_string(client):
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=30, temperature=0).choices[0].text
    word = full.split()[3]  # a word in the middle of the greedy text
    cut = full[: full.index(word)]
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=30, temperature=0, stop=[word, "zzzz"])
    assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=30, temperature=0, stop=word, stream=True))
    assert streamed == cut  # never streamed past the stop string


def test_logprobs(client):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    for tok, val, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert val <= 0 and len(top) == 3
        assert abs(max(top.values()) - val) < 1e-4  # greedy: the sampled token is the most likely
    c = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                       temperature=0, logprobs=True, top_logprobs=2)
    content = c.choices[0].logprobs.content
    assert len(content) == 4 and all(len(x.top_logprobs) == 2 and x.logprob <= 0 for x in content)


def test_seed_reproducible(client):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=1.0, top_p=0.95)
    a = client.completions.create(seed=1234, **kw).choices[0].text
    b = client.completions.create(seed=1234, **kw).choices[0].text
    texts = {client.completions.create(seed=s, **kw).choices[0].text for s in range(5)}
    assert a == b
    assert len(texts) > 1  # different seeds do sample differently


@pytest.mark.parametrize("field,value", [
    ("temperature", -1), ("temperature", "hot"), ("top_p", 1.5), ("max_tokens", 0), ("n", 0),
    ("logprobs", 99), ("stop", 5), ("presence_penalty", 3), ("logit_bias", {"x": 1}), ("prompt", []),
    ("echo", "yes"),
    ("stream_options", {"include_usage": True}), ("max_tokens", 100000),
])
def test_invalid_field_is_400_naming_it(stories_server, field, value):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, field: value}
    r = requests.post(stories_server.url + "/v1/completions", json=body, timeout=10)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == field and err["message"]


def test_errors_through_openai_client(client, stories_server):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[], max_tokens=2)
    assert e.value.body["param"] == "messages"
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=2)
    assert e.value.body["code"] == "model_not_found"
    # Not JSON, numbers past double's range (nlohmann's out_of_range: a 500 until fuzz_openai_request), and
    # nesting 100k deep (it overflowed the stack in the chat template's conversion and killed the server).
    deep = "[" * 100000 + "]" * 100000
    for path, bad in (("completions", "{not json"),
                      ("completions", '{"model": "%s", "prompt": "x", "max_tokens": 1e999}' % MODEL),
                      ("chat/completions",
                       '{"model": "%s", "messages": [{"role": "user", "content": "x"}], "tools": [%s]}' % (MODEL, deep))):
        r = requests.post(f"{stories_server.url}/v1/{path}", data=bad, timeout=10)
        assert r.status_code == 400 and "JSON" in r.json()["error"]["message"], r.text
        assert r.json()["error"]["code"] == "invalid_json"
    assert requests.get(stories_server.url + "/health", timeout=10).status_code == 200


def test_64_concurrent_streams_match_sequential(client):
    prompts = [f"{PROMPT} there was a {w}" for w in
               ["girl", "boy", "dog", "cat", "bird", "fish", "tree", "king"] for _ in range(1)]
    prompts = [f"{p}{'.' * (i // 8)}" for i, p in enumerate(prompts * 8)]  # 64 distinct prompts
    assert len(set(prompts)) == 64

    def one(p):
        chunks = client.completions.create(model=MODEL, prompt=p, max_tokens=24, temperature=0, stream=True)
        return "".join(c.choices[0].text for c in chunks)

    sequential = [one(p) for p in prompts]
    with ThreadPoolExecutor(max_workers=64) as pool:
        concurrent = list(pool.map(one, prompts))
    assert concurrent == sequential


def test_unhonourable_requests_are_refused_not_ignored(client):
    # A schema keyword that is not enforced (pattern) and forced tool calls: a client asking for them must
    # learn it at once, not receive free text it takes for the answer.
    msgs = [{"role": "user", "content": "Hi"}]
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "^a+$"}}}
    for kw, param in ((dict(response_format=schema), "response_format"),
                      (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
                            tool_choice="required"), "tool_choice")):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2, **kw)
        assert e.value.body["param"] == param
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2, response_format={"type": "text"})
    assert r.usage.completion_tokens == 2
