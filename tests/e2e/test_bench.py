"""`inferx bench`: the offline engine benchmark (with its in-process roofline) and the HTTP benchmark
against a running `inferx serve`, checked for what they count and report, not for speed."""
import json
import os
import subprocess

from conftest import STORIES, inferx_bin, run_server


def bench(*args, timeout=120, env=None):
    return subprocess.run([str(inferx_bin()), "bench", *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def test_offline_counts_every_token_and_reports_the_roofline():
    r = bench("offline", "-m", str(STORIES), "--threads", "1", "--num-prompts", "3", "--input-len", "16",
              "--output-len", "5", "--max-batch-size", "2", "--warmup", "1", "--no-progress", "--json",
              "--roofline")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert (j["completed"], j["failed"]) == (3, 0)
    assert (j["total_input_tokens"], j["total_output_tokens"]) == (48, 15)
    assert j["mode"] == "offline" and j["num_prompts"] == 3 and j["max_batch_size"] == 2
    assert 0 < j["ttft_ms"]["p50"] <= j["e2e_ms"]["p99"]
    assert j["tpot_ms"]["p50"] > 0 and j["output_throughput"] > 0
    # The engine's counters: at least one step per output token of a request; on the CPU no padded (graph)
    # decode steps and none overlapped (that needs device sampling).
    eng = j["engine"]
    assert eng["steps"] >= 5 and eng["preemptions"] == 0
    assert eng["decode_graph_steps"] == 0 and eng["overlapped_decode_steps"] == 0
    assert eng["decode_graph_replays"] == 0
    roof = j["roofline"]
    assert roof["weight_bytes_per_token"] > 0 and roof["bandwidth_gbs"] > 0
    assert "host streaming read" in roof["probe"] and "1 threads" in roof["probe"]
    # batch-1 roofline = bandwidth / bytes per token, and the ratio compares TPOT p50 with that pass.
    want = roof["bandwidth_gbs"] * 1e9 / roof["weight_bytes_per_token"]
    assert abs(roof["batch1_roofline_tok_s"] / want - 1) < 1e-9
    assert abs(roof["tpot_p50_roofline_ratio"] - roof["weight_stream_ms"] / j["tpot_ms"]["p50"]) < 1e-9


def test_offline_text_output_and_no_roofline_by_default():
    r = bench("offline", "-m", str(STORIES), "--threads", "1", "--num-prompts", "2", "--input-len", "8",
              "--output-len", "3", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "roofline" not in r.stdout
    r = bench("offline", "-m", str(STORIES), "--threads", "1", "--num-prompts", "2", "--input-len", "8",
              "--output-len", "3", "--no-progress", "--roofline")
    assert r.returncode == 0, r.stderr
    assert "roofline:" in r.stdout and "tok/s at batch 1" in r.stdout


def test_offline_warm_up_runs_before_the_timed_requests_unless_turned_off():
    # The startup warm-up runs where decode steps are padded (CUDA graphs; INFERX_GRAPHS=pad on the CPU):
    # the step sizes and every decode bucket before the first request, reported in the engine's counters
    # and logged; --no-warmup leaves it out.
    env = dict(os.environ, INFERX_GRAPHS="pad")
    args = ("offline", "-m", str(STORIES), "--threads", "1", "--num-prompts", "3", "--input-len", "16",
            "--output-len", "5", "--max-batch-size", "4", "--max-num-batched-tokens", "64", "--no-progress",
            "--json")
    r = bench(*args, env=env)
    assert r.returncode == 0, r.stderr
    eng = json.loads(r.stdout)["engine"]
    assert eng["warm_up_s"] > 0 and eng["decode_graph_steps"] > 0
    assert "warm-up: 4 step sizes (8..64 tokens), 3 decode sizes" in r.stderr
    r = bench(*args, "--no-warmup", env=env)
    assert r.returncode == 0, r.stderr
    eng = json.loads(r.stdout)["engine"]
    assert eng["warm_up_s"] == 0 and eng["decode_graph_steps"] > 0
    assert "warm-up" not in r.stderr


def test_offline_rejects_lengths_past_the_context():
    r = bench("offline", "-m", str(STORIES), "--threads", "1", "--num-prompts", "1", "--input-len", "600",
              "--output-len", "600", "--no-progress")
    assert r.returncode != 0
    assert "max_model_len" in r.stderr


def test_serve_benchmark_against_a_running_server(tmp_path):
    with run_server(tmp_path) as s:
        r = bench("serve", "--url", s.url, "--num-prompts", "4", "--input-len", "8", "--output-len", "4",
                  "--concurrency", "2", "--no-progress", "--json")
        assert r.returncode == 0, r.stderr
        j = json.loads(r.stdout)
        assert (j["completed"], j["failed"]) == (4, 0)
        assert j["total_output_tokens"] == 16
        assert j["ttft_ms"]["p50"] > 0
        # The server saw those requests and tokens.
        m = s.metrics()
        assert m['inferx_requests_total{finish_reason="length"}'] == 4, m
        assert m["inferx_prompt_tokens_total"] == 32 and m["inferx_generation_tokens_total"] == 16, m


def test_serve_benchmark_survives_odd_server_json():
    """The server under test may be any OpenAI-compatible one: JSON fields of unexpected types (a float
    vocab_size of 1e300, a float usage count, choices as an object) must not crash the client (nlohmann's
    integer get of such a float was undefined behaviour), and an event stream sent with a Content-Length
    (not chunked) and CR LF line ends is still read as events (it counted as failed requests before)."""
    import http.server
    import threading

    class Odd(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def reply(self, body, ctype="application/json"):
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self.reply(json.dumps({"data": [{"id": "odd", "vocab_size": 1e300, "max_model_len": -5.5}]}))

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            events = [{"choices": {"0": {"text": "x"}}}, {"choices": [{"text": "a"}]},
                      {"choices": [{"text": "b"}], "usage": {"prompt_tokens": 9e300, "completion_tokens": 2}}]
            # Sent with a Content-Length, not chunked; CR LF line ends and "data:" without its space, as
            # some servers write them.
            self.reply("".join(f"data:{json.dumps(e)}\r\n\r\n" for e in events) + "data: [DONE]\r\n\r\n",
                       "text/event-stream")

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Odd)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        r = bench("serve", "--url", f"http://127.0.0.1:{server.server_address[1]}", "--num-prompts", "3",
                  "--input-len", "8", "--output-len", "4", "--concurrency", "1", "--no-progress", "--json",
                  timeout=60)
    finally:
        server.shutdown()
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert (j["completed"], j["failed"]) == (3, 0), j
    assert j["total_output_tokens"] == 6, j  # the integer usage count; the float one is ignored
