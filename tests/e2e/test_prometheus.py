"""/metrics checked by a real Prometheus server (Debian package `prometheus`): it scrapes `inferx serve`
every second and answers PromQL queries about the traffic generated here."""
import shutil
import subprocess
import time

import pytest
import requests

from conftest import free_port, run_server


def prometheus_query(url, query):
    r = requests.get(url + "/api/v1/query", params={"query": query}, timeout=5)
    r.raise_for_status()
    body = r.json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_prometheus_scrapes_inferx_metrics(tmp_path):
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.fail("prometheus is not installed (scripts/install-deps.sh installs the Debian package)")
    with run_server(tmp_path) as s:
        for i in range(3):
            r = requests.post(s.url + "/v1/completions", timeout=30, json={
                "model": "stories260K", "prompt": "Once upon a time", "max_tokens": 8 + i, "temperature": 0})
            assert r.status_code == 200
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: inferx\n    scrape_interval: 1s\n"
            f"    static_configs:\n      - targets: ['127.0.0.1:{s.port}']\n")
        log = open(tmp_path / "prometheus.log", "wb")
        proc = subprocess.Popen([prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            result = []
            while time.monotonic() < deadline:
                assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
                try:
                    result = prometheus_query(url, "sum(inferx_generation_tokens_total) > 0")
                    if result:
                        break
                except requests.RequestException:
                    pass
                time.sleep(0.25)
            assert result, "Prometheus never saw inferx_generation_tokens_total > 0"
            assert float(result[0]["value"][1]) == 8 + 9 + 10
            up = prometheus_query(url, 'up{job="inferx"}')
            assert up and up[0]["value"][1] == "1"
            # The labelled latency histogram parsed as such: a quantile over its buckets is computable.
            q = prometheus_query(url, 'histogram_quantile(0.5, sum by (le) '
                                      '(inferx_inference_latency_seconds_bucket{input_length_bin="tiny"}))')
            assert q and float(q[0]["value"][1]) > 0
            finished = prometheus_query(url, 'inferx_requests_total{finish_reason="length"}')
            assert finished and float(finished[0]["value"][1]) == 3
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
