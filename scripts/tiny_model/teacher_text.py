#!/usr/bin/env python3
"""Sample stories from a running `inferx serve` of the trained stories260K (the teacher) for train.py.

    inferx serve -m ../shared/testdata/stories260K.gguf --port 8099 --max-model-len 512 --max-batch-size 256 &
    python3 scripts/tiny_model/teacher_text.py --port 8099 --stories 12000 --out /tmp/teacher.txt

One story per request (temperature 1, a fixed seed per request so a rerun gives the same text), each
prompted with one of a few openings; stories are separated by blank lines in the output.
"""
import argparse
import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

OPENINGS = ["Once upon a time", "One day", "Tom", "Lily", "There was a", "The little", "Sue and Ben",
            "Once there was", "Mom", "It was a sunny day", "Tim had a", "A big", "Anna", "The cat",
            "Max and his", "In a small town", "The sun", "Ben wanted", "Sara", "One morning"]


def one(url, i):
    body = {"model": "stories260K", "prompt": OPENINGS[i % len(OPENINGS)], "max_tokens": 400,
            "temperature": 1.0, "seed": i}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return body["prompt"] + json.loads(r.read())["choices"][0]["text"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8099)
    ap.add_argument("--stories", type=int, default=12000)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    url = f"http://127.0.0.1:{a.port}/v1/completions"
    t0 = time.time()
    with ThreadPoolExecutor(a.concurrency) as pool:
        texts = list(pool.map(lambda i: one(url, i), range(a.stories)))
    with open(a.out, "w") as f:
        for t in texts:
            f.write(t.strip() + "\n\n")
    chars = sum(len(t) for t in texts)
    print(json.dumps({"stories": len(texts), "chars": chars, "seconds": round(time.time() - t0, 1)}))


if __name__ == "__main__":
    main()
