"""Auth, admission (429), client disconnects and SIGTERM drain of a real `inferx serve`."""
import signal
import socket
import threading
import time
import json

import openai
import pytest
import requests

from conftest import run_server

# dummy:tiny has no tokenizer (token-id prompts) but a 2048-token context: long enough to be slow.
DUMMY = "dummy:tiny"


def long_body(max_tokens=1500, stream=False):
    return {"model": DUMMY, "prompt": [5, 6, 7, 8], "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": stream}


def wait_for(cond, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_api_key(tmp_path):
    with run_server(tmp_path, "--api-key", "sekret") as s:
        bad = openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0)
        try:
            bad.models.list()
            raise AssertionError("expected 401")
        except openai.AuthenticationError as e:
            assert e.status_code == 401 and e.body["code"] == "invalid_api_key"
        assert requests.get(s.url + "/v1/models", timeout=5).status_code == 401
        good = openai.OpenAI(base_url=s.url + "/v1", api_key="sekret", max_retries=0)
        assert good.completions.create(model="stories260K", prompt="Hi", max_tokens=2).usage.completion_tokens == 2
        assert requests.get(s.url + "/health", timeout=5).status_code == 200  # probes need no key
        # The tokenizer routes sit outside /v1 but expose the model: they need the key too.
        assert requests.post(s.url + "/tokenize", json={"prompt": "Hi"}, timeout=5).status_code == 401
        ok = requests.post(s.url + "/tokenize", json={"prompt": "Hi"}, timeout=5,
                           headers={"Authorization": "Bearer sekret"})
        assert ok.status_code == 200 and ok.json()["count"] >= 1


def test_queue_full_is_429_with_retry_after(tmp_path):
    # One running sequence at a time and room for one waiting request: of 6 simultaneous slow requests,
    # at most 2 are admitted and the others get 429.
    with run_server(tmp_path, "--max-batch-size", "1", "--max-queue", "1", model=DUMMY) as s:
        results = []

        def post():
            r = requests.post(s.url + "/v1/completions", json=long_body(1000), timeout=60)
            results.append((r.status_code, r.headers.get("Retry-After"), r.json()))

        threads = [threading.Thread(target=post) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        codes = sorted(c for c, _, _ in results)
        assert len(codes) == 6
        assert 1 <= codes.count(200) <= 2 and codes.count(429) >= 4, codes
        for code, retry, body in results:
            if code == 429:
                assert retry is not None and int(retry) >= 1
                assert body["error"]["type"] == "rate_limit_error"
        # A batch of more prompts than the queue ever holds is a 400 (retrying could never help), not a 429.
        batch = long_body(4)
        batch["prompt"] = [[5, 6], [7, 8]]
        r = requests.post(s.url + "/v1/completions", json=batch, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text


@pytest.mark.parametrize("prompts", [1, 3])
def test_disconnect_aborts_and_frees_blocks(tmp_path, prompts):
    with run_server(tmp_path, model=DUMMY) as s:
        assert s.metrics()["inferx_kv_cache_blocks_used"] == 0
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        body = long_body(2000, stream=True)
        if prompts > 1:  # a batch of prompts runs as one engine request each: all of them are aborted
            body["prompt"] = [[5, 6, 7, 8 + i] for i in range(prompts)]
        body = json.dumps(body).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")  # streaming has begun
        wait_for(lambda: s.metrics()["inferx_kv_cache_blocks_used"] > 0, what="blocks in use")
        sock.close()
        wait_for(lambda: s.metrics().get('inferx_requests_total{finish_reason="abort"}', 0) == prompts,
                 what="the request to be aborted")
        m = s.metrics()
        assert m["inferx_kv_cache_blocks_used"] == 0 and m["inferx_num_requests_running"] == 0
        assert m.get('inferx_requests_total{finish_reason="length"}', 0) == 0


def test_sigterm_drains_in_flight_request(tmp_path):
    with run_server(tmp_path, model=DUMMY) as s:
        result = {}

        def post():
            r = requests.post(s.url + "/v1/completions", json=long_body(1500), timeout=60)
            result["status"], result["body"] = r.status_code, r.json()

        t = threading.Thread(target=post)
        t.start()
        wait_for(lambda: s.metrics()["inferx_num_requests_running"] == 1, what="the request to run")
        s.proc.send_signal(signal.SIGTERM)
        # New connections are refused (or answered 503) while the request drains.
        time.sleep(0.05)
        try:
            code = requests.post(s.url + "/v1/completions", json=long_body(2), timeout=5).status_code
            assert code == 503
        except requests.ConnectionError:
            pass
        t.join(timeout=60)
        assert result["status"] == 200, result
        assert result["body"]["usage"]["completion_tokens"] == 1500
        assert result["body"]["choices"][0]["finish_reason"] == "length"
        assert s.proc.wait(timeout=30) == 0
        assert "draining" in s.log_text()
