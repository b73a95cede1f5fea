"""`inferx serve --tool-call-parser`: the flag's plumbing end to end. The parsing itself (hermes, llama3_json,
mistral; streamed and not) is unit-tested in tests/unit/server/tool_calls_test.cpp: stories260K cannot be
made to write a call, so here a reply that is not a call must come back as plain content, unchanged."""
import json
import subprocess

import openai
import requests

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


def test_forced_calls_are_constrained_and_parsed(tmp_path):
    # tool_choice "required" / a named function: the reply is constrained to one hermes call whose arguments
    # follow the tool's parameter schema, and comes back as tool_calls with finish_reason tool_calls.
    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATE)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
                 "type": "object", "properties": {"u": {"enum": ["c", "f"]}}, "required": ["u"]}}},
             {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]
    with run_server(tmp_path, "--chat-template", str(template), "--tool-call-parser", "hermes") as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        msgs = [{"role": "user", "content": "W?"}]
        for choice, names in (("required", {"f", "now"}), ({"type": "function", "function": {"name": "f"}}, {"f"})):
            for seed in range(2):
                r = client.chat.completions.create(model=MODEL, messages=msgs, tools=tools, tool_choice=choice,
                                                   max_tokens=110, temperature=0.8, seed=seed, logit_bias={"128": 3})
                c = r.choices[0]
                assert c.finish_reason == "tool_calls" and c.message.content is None, c
                call = c.message.tool_calls[0]
                assert call.type == "function" and call.function.name in names and call.id.startswith("call_")
                args = json.loads(call.function.arguments)
                assert args in ({"u": "c"}, {"u": "f"}) if call.function.name == "f" else isinstance(args, dict)
        # What cannot be forced is refused, naming the field.
        for kw, param in ((dict(tool_choice={"type": "function", "function": {"name": "missing"}}), "tool_choice"),
                          (dict(tool_choice="required", response_format={"type": "json_object"}), "tool_choice")):
            try:
                client.chat.completions.create(model=MODEL, messages=msgs, tools=tools, max_tokens=4, **kw)
                raise AssertionError("expected a 400")
            except openai.BadRequestError as e:
                assert e.body["param"] == param, e.body
    # Without a parser the server cannot know the call format: refused.
    with run_server(tmp_path, "--chat-template", str(template)) as s:
        r = requests.post(s.url + "/v1/chat/completions", timeout=10, json={
            "model": MODEL, "messages": [{"role": "user", "content": "W?"}], "tools": tools, "tool_choice": "required"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice", r.text
