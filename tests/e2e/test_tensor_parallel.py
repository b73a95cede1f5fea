"""`inferx serve --tensor-parallel-size N` on the CPU (N backends in one process, the in-process
communicator), driven by the real openai client: the served greedy text is llama2.c's reference for
stories260K (as with one rank), streams and concurrent requests agree with sequential ones, and a size the
model does not split into is a clear startup error."""
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from conftest import STORIES, TESTDATA, inferx_bin, run_server

MODEL = "stories260K"


@pytest.fixture(scope="module", params=[2, 4])
def tp_client(request, tmp_path_factory):
    if not STORIES.exists():
        pytest.skip(f"{STORIES} missing")
    with run_server(tmp_path_factory.mktemp(f"tp{request.param}"), "--tensor-parallel-size",
                    str(request.param)) as s:
        assert f"tensor parallel over {request.param} ranks" in s.log_text()
        yield openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_greedy_text_is_the_llama2c_reference(tp_client):
    ref = json.loads((TESTDATA / "stories260K.greedy.json").read_text())["cases"][1]
    out_ids = ref["output_ids"][:100]  # the model's context is 128 tokens
    r = tp_client.completions.create(model=MODEL, prompt=ref["input_ids"], max_tokens=len(out_ids), temperature=0)
    assert r.usage.completion_tokens == len(out_ids)
    assert ref["text"][len(ref["prompt"]):].startswith(r.choices[0].text)


def test_concurrent_streams_match_sequential(tp_client):
    prompts = [f"Once upon a time there was a {w}" for w in ["girl", "boy", "dog", "cat", "bird", "fish", "tree", "king"]]
    prompts = [f"{p}{'.' * i}" for i, p in enumerate(prompts * 2)]  # 16 distinct prompts

    def one(p):
        chunks = tp_client.completions.create(model=MODEL, prompt=p, max_tokens=20, temperature=0, stream=True)
        return "".join(c.choices[0].text for c in chunks)

    sequential = [one(p) for p in prompts]
    with ThreadPoolExecutor(max_workers=16) as pool:
        assert list(pool.map(one, prompts)) == sequential


def test_a_size_that_does_not_split_the_model_is_a_startup_error():
    if not STORIES.exists():
        pytest.skip(f"{STORIES} missing")
    # stories260K has 8 attention heads: 3 ranks cannot share them.
    p = subprocess.run([str(inferx_bin()), "serve", "--model", str(STORIES), "--port", "0", "--tensor-parallel-size",
                        "3"], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "--tensor-parallel-size 3" in p.stderr and "heads" in p.stderr, p.stderr
