"""`inferx serve --tool-call-parser`: the flag's plumbing end to end. The parsing itself (hermes, llama3_json,
mistral; streamed and not) is unit-tested in tests/unit/server/tool_calls_test.cpp: stories260K cannot be
made to write a call, so here a reply that is not a call must come back as plain content, unchanged."""
import subprocess

import openai

from conftest import STORIES, inferx_bin, run_server

MODEL = "stories260K"
# A short template that shows the tools (the real ones do not fit stories260K's 128-token context).
TEMPLATE = "{% if tools %}[{{ tools | length }} tools]{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def test_reply_without_a_call_is_content(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATE)
    with run_server(tmp_path, "--chat-template", str(template), "--tool-call-parser", "hermes",
                    "--enable-auto-tool-choice") as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        msgs = [{"role": "user", "content": "Once upon a time"}]
        plain = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, temperature=0)
        with_tools = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, temperature=0,
                                                    tools=TOOLS)
        m = with_tools.choices[0].message
        assert m.tool_calls is None and m.content and with_tools.choices[0].finish_reason == "length"
        assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens  # the template saw the tools
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=MODEL, messages=msgs, max_tokens=12, temperature=0, tools=TOOLS, stream=True) if c.choices)
        assert streamed == m.content


def test_bad_parser_flags_are_cli_errors():
    for args, needle in ((["--tool-call-parser", "nope"], "hermes, llama3_json, mistral"),
                         (["--enable-auto-tool-choice"], "--tool-call-parser")):
        r = subprocess.run([str(inferx_bin()), "serve", "--model", str(STORIES), "--port", "0", *args],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and needle in r.stderr, r.stderr
