"""/v1/completions with several prompts in one request, echo, and GET /v1/models/{model}: the OpenAI reference's
forms, driven by the real openai client against `inferx serve` (stories260K)."""
import openai
import pytest
import requests

from test_openai_api import MODEL

PROMPTS = ["Once upon a time", "The little dog", "Lily and Ben went to the park"]


def greedy(client, prompt, max_tokens=12):
    return client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0)


def test_batch_of_text_prompts_matches_one_request_each(client):
    singles = [greedy(client, p) for p in PROMPTS]
    r = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=12, temperature=0, n=2)
    assert [c.index for c in r.choices] == list(range(2 * len(PROMPTS)))
    for i, single in enumerate(singles):
        # choice index = prompt * n + j; greedy, so both choices of a prompt equal its own request's text
        assert r.choices[2 * i].text == single.choices[0].text
        assert r.choices[2 * i + 1].text == single.choices[0].text
    assert r.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    assert r.usage.completion_tokens == 2 * sum(s.usage.completion_tokens for s in singles)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_batch_of_token_id_prompts(client):
    ids = [[1, 403, 407, 261, 378], [1, 400], [1, 365, 263]]
    singles = [greedy(client, p, 8).choices[0].text for p in ids]
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
    assert [c.text for c in r.choices] == singles
    assert r.usage.prompt_tokens == sum(len(p) for p in ids)


def test_batch_streamed_per_choice(client):
    singles = [greedy(client, p, 10).choices[0].text for p in PROMPTS]
    texts, finish = {}, {}
    usage = None
    for chunk in client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=10, temperature=0,
                                           stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert [texts[i] for i in range(len(PROMPTS))] == singles
    assert finish == {i: "length" for i in range(len(PROMPTS))}
    assert usage.completion_tokens == 10 * len(PROMPTS)


def test_batch_with_a_prompt_past_the_context_is_refused_whole(client, stories_server):
    before = stories_server.metrics().get("inferx_prompt_tokens_total", 0.0)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=["Once", "word " * 300], max_tokens=4)
    assert e.value.body["code"] == "context_length_exceeded"
    assert stories_server.metrics().get("inferx_prompt_tokens_total", 0.0) == before  # nothing ran


def test_echo(client):
    plain = greedy(client, PROMPTS[0]).choices[0].text
    r = client.completions.create(model=MODEL, prompt=PROMPTS[:2], max_tokens=12, temperature=0, echo=True)
    assert r.choices[0].text == PROMPTS[0] + plain
    assert r.choices[1].text.startswith(PROMPTS[1])
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=PROMPTS[0], max_tokens=12, temperature=0, echo=True, stream=True))
    assert streamed == PROMPTS[0] + plain
    # A token-id prompt echoes its decoded text.
    ids = client.completions.create(model=MODEL, prompt=[1, 403, 407], max_tokens=1, temperature=0, echo=True)
    assert ids.choices[0].text.startswith("Once")


def test_echo_with_logprobs_is_refused(stories_server):
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2, "echo": True, "logprobs": 1}
    r = requests.post(stories_server.url + "/v1/completions", json=body, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo", r.text


def test_retrieve_model(client, stories_server):
    m = client.models.retrieve(MODEL)
    assert m.id == MODEL and m.object == "model" and m.owned_by == "inferx"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("org/other-model")
    assert e.value.body["code"] == "model_not_found"
    assert requests.post(stories_server.url + f"/v1/models/{MODEL}", timeout=5).status_code == 405
    # Probing arbitrary paths does not grow the responses metric's label set.
    for i in range(5):
        assert requests.get(f"{stories_server.url}/no/such/path/{i}", timeout=5).status_code == 404
    labels = [k for k in stories_server.metrics() if k.startswith("inferx_http_responses_total{")]
    assert not any("/no/such/path" in k for k in labels)
    assert any('route="other"' in k and 'status="404"' in k for k in labels), labels


def test_tokenize_and_detokenize(client, stories_server):
    url = stories_server.url
    r = requests.post(url + "/tokenize", json={"model": MODEL, "prompt": PROMPTS[0]}, timeout=10).json()
    single = greedy(client, PROMPTS[0], 1)
    assert r["count"] == len(r["tokens"]) == single.usage.prompt_tokens and r["max_model_len"] == 128
    assert r["token_strs"] is None
    plain = requests.post(url + "/tokenize", json={"prompt": PROMPTS[0], "add_special_tokens": False,
                                                   "return_token_strs": True}, timeout=10).json()
    assert plain["tokens"] == r["tokens"][1:] and len(plain["token_strs"]) == plain["count"]  # no BOS
    assert requests.post(url + "/detokenize", json={"tokens": plain["tokens"]}, timeout=10).json() == {
        "prompt": PROMPTS[0]}
    chat = requests.post(url + "/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]},
                         timeout=10).json()
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=1)
    assert chat["count"] == reply.usage.prompt_tokens  # the same template and tokens as chat completions
    for path, body, param in (("/detokenize", {"tokens": [99999]}, "tokens"), ("/tokenize", {}, "prompt"),
                              ("/tokenize", {"messages": []}, "messages")):
        bad = requests.post(url + path, json=body, timeout=10)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == param, bad.text
    assert requests.post(url + "/tokenize", json={"model": "x", "prompt": "a"}, timeout=10).status_code == 404
    assert requests.get(url + "/tokenize", timeout=10).status_code == 405
