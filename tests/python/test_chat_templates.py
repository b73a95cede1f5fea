"""Chat-template conformance: `inferx chat-template` must render every real template in
../shared/testdata/chat_templates byte-identically to Python jinja2 configured the way transformers'
apply_chat_template configures it (transformers/utils/chat_template_utils.py, _compile_jinja_template and
render_jinja_template): ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the
loopcontrols extension, transformers' own `tojson` filter (json.dumps with ensure_ascii=False), the
`raise_exception` and `strftime_now` globals, and render(messages=, tools=, documents=None,
add_generation_prompt=, **special tokens, **extra kwargs).

Where jinja2 raises (a template rejecting a conversation shape), inferx must fail too, with the template's
raise_exception message. Each template must render most conversations successfully so the comparison is
not vacuous.

Environment: INFERX_BIN (default build/cpu/src/cli/inferx), INFERX_TESTDATA_DIR (default ../shared/testdata).
"""

import copy
import json
import os
import subprocess
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = Path(__file__).resolve().parents[2]
TESTDATA = Path(os.environ.get("INFERX_TESTDATA_DIR", ROOT.parent / "shared" / "testdata"))
TEMPLATE_DIR = TESTDATA / "chat_templates"
INFERX_BIN = os.environ.get("INFERX_BIN", str(ROOT / "build" / "cpu" / "src" / "cli" / "inferx"))
FIXED_DATE = "2024-07-26"  # strftime_now() on both sides (Llama 3.2, Mistral Small, Granite, gpt-oss)

TEMPLATES = sorted(TEMPLATE_DIR.glob("*.jinja")) if TEMPLATE_DIR.is_dir() else []


# --- the reference renderer (transformers' configuration) --------------------------------------------------
def _reference_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    fixed = datetime.strptime(FIXED_DATE, "%Y-%m-%d")

    def strftime_now(fmt):
        return fixed.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = _reference_env()


def reference_render(source, case, add_generation_prompt, bos, eos):
    template = ENV.from_string(source)
    kwargs = {"bos_token": bos, "eos_token": eos}
    kwargs.update(copy.deepcopy(case.get("extra", {})))
    return template.render(
        messages=copy.deepcopy(case["messages"]),
        tools=copy.deepcopy(case.get("tools")),
        documents=kwargs.pop("documents", None),
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )


# --- conversations -------------------------------------------------------------------------------------------
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"},
                "days": {"type": "integer", "description": "Forecast days", "default": 1},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look for"},
                "max_results": {"type": "number", "description": "At most this many"},
                "strict": {"type": "boolean", "description": "Exact match only"},
                "filters": {
                    "type": "object",
                    "description": "Extra filters",
                    "properties": {"site": {"type": "string"}},
                    "additionalProperties": {"type": "string"},
                },
                "tags": {"type": "array", "items": {"type": "string"}, "description": "Tags to match"},
                "lang": {"type": ["string", "null"], "description": "Language or null"},
            },
            "required": ["query", "strict"],
        },
    },
}
COHERE_TOOLS = [
    {
        "name": "internet_search",
        "description": "Returns a list of relevant document snippets for a textual query retrieved from the internet",
        "parameter_definitions": {
            "query": {"description": "Query to search the internet with", "type": "str", "required": True},
            "limit": {"description": "Max results", "type": "int", "required": False},
        },
    },
    {"name": "directly_answer", "description": "Calls a standard chat model", "parameter_definitions": {}},
]

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}
U1 = {"role": "user", "content": "Hello! What's the capital of France?"}
A1 = {"role": "assistant", "content": "The capital of France is Paris."}
U2 = {"role": "user", "content": "And of Japan?"}
CALL_ARGS = {"city": "Paris", "unit": "celsius", "days": 2}


def tool_call(args, call_id="call12345"):
    return {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": args}}


def tool_turns(args):
    return [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [tool_call(args)]},
        {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": '{"temperature": 21.5, "sky": "sunny"}'},
        {"role": "assistant", "content": "It is 21.5 °C and sunny in Paris."},
        {"role": "user", "content": "Thanks! And tomorrow?"},
    ]


CASES = {
    "system_multi_turn": {"messages": [SYSTEM, U1, A1, U2]},
    "no_system": {"messages": [U1, A1, U2]},
    "single_user": {"messages": [U1]},
    "ends_with_assistant": {"messages": [SYSTEM, U1, A1]},
    "whitespace_unicode": {
        "messages": [
            {"role": "system", "content": "  Sei un assistente.\n\n"},
            {"role": "user", "content": "\t¿Qué tal?  日本語のテキスト 🚀 \"quotes\" and 'single' \\ backslash\n"},
            {"role": "assistant", "content": "  Muy bien — gracias! 😀\n"},
            {"role": "user", "content": "Line one\nLine two\r\nLine three   "},
        ]
    },
    "thinking_history": {
        "messages": [
            U1,
            {"role": "assistant", "content": "<think>\nThe user asks about France.\n</think>\n\nParis."},
            U2,
        ],
        "extra": {"enable_thinking": False},
    },
    "tools_no_calls": {"messages": [SYSTEM, U1], "tools": [WEATHER_TOOL, SEARCH_TOOL]},
    "tools_no_system": {"messages": [U1], "tools": [WEATHER_TOOL]},
    "tool_call_dict_args": {"messages": [SYSTEM] + tool_turns(CALL_ARGS), "tools": [WEATHER_TOOL, SEARCH_TOOL]},
    "tool_call_string_args": {"messages": tool_turns(json.dumps(CALL_ARGS)), "tools": [WEATHER_TOOL]},
    "tool_call_nested_args": {
        "messages": tool_turns(
            {"city": "Zürich", "coords": [47.37, 8.54, -1e-07, 1e21], "flags": {"metric": True, "note": None},
             "empty": {}, "list": [], "quote": "say \"hi\"\n"}
        ),
        "tools": [WEATHER_TOOL],
    },
    "cohere_tools": {"messages": [SYSTEM, U1, A1, U2], "tools": COHERE_TOOLS},
    "documents": {
        "messages": [U1],
        "extra": {
            "documents": [
                {"doc_id": 1, "title": "Paris", "text": "Paris is the capital of France."},
                {"doc_id": 2, "title": "Tokyo", "text": "Tokyo is the capital of Japan."},
            ]
        },
    },
    "gpt_oss_thinking": {
        "messages": [
            {"role": "developer", "content": "Be terse."},
            U1,
            {"role": "assistant", "content": "Paris.", "thinking": "Easy geography question."},
            U2,
        ],
        "extra": {"reasoning_effort": "high", "builtin_tools": ["browser", "python"]},
    },
    "builtin_tools_llama": {
        "messages": [SYSTEM, U1],
        "tools": [WEATHER_TOOL],
        "extra": {"builtin_tools": ["brave_search", "wolfram_alpha"], "tools_in_user_message": False},
    },
    "system_only_alternation_error": {"messages": [SYSTEM, U1, U2]},
}

DEFAULT_TOKENS = ("<s>", "</s>")
TOKENS = {
    "meta-llama": ("<|begin_of_text|>", "<|eot_id|>"),
    "NousResearch": ("<|begin_of_text|>", "<|im_end|>"),
    "Qwen": ("", "<|im_end|>"),
    "deepseek": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "google": ("<bos>", "<eos>"),
    "CohereForAI": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    "openai": ("<|startoftext|>", "<|return|>"),
    "ibm": ("<|end_of_text|>", "<|end_of_text|>"),
    "microsoft": ("<s>", "<|endoftext|>"),
}


def tokens_for(path):
    for prefix, toks in TOKENS.items():
        if path.name.startswith(prefix):
            return toks
    return DEFAULT_TOKENS


# --- the engine under test -----------------------------------------------------------------------------------
def inferx_render(tmp_path, template, case, add_generation_prompt, bos, eos):
    messages = tmp_path / "messages.json"
    messages.write_text(json.dumps(case["messages"], ensure_ascii=False), encoding="utf-8")
    cmd = [INFERX_BIN, "chat-template", "--template", str(template), "--messages", str(messages),
           "--bos", bos, "--eos", eos, "--date", FIXED_DATE]
    if case.get("tools") is not None:
        tools = tmp_path / "tools.json"
        tools.write_text(json.dumps(case["tools"], ensure_ascii=False), encoding="utf-8")
        cmd += ["--tools", str(tools)]
    if case.get("extra"):
        extra = tmp_path / "extra.json"
        extra.write_text(json.dumps(case["extra"], ensure_ascii=False), encoding="utf-8")
        cmd += ["--extra", str(extra)]
    if add_generation_prompt:
        cmd.append("--add-generation-prompt")
    return subprocess.run(cmd, capture_output=True, timeout=60)


def _require_inputs():
    if not TEMPLATES:
        pytest.skip(f"no chat templates under {TEMPLATE_DIR}")
    if not os.access(INFERX_BIN, os.X_OK):
        pytest.skip(f"inferx binary not built: {INFERX_BIN} (set INFERX_BIN)")


@pytest.mark.parametrize("add_generation_prompt", [False, True], ids=["no_gen", "gen"])
@pytest.mark.parametrize("case_name", sorted(CASES))
@pytest.mark.parametrize("template", TEMPLATES, ids=[t.stem for t in TEMPLATES])
def test_render_matches_jinja2(tmp_path, template, case_name, add_generation_prompt):
    _require_inputs()
    case = CASES[case_name]
    bos, eos = tokens_for(template)
    source = template.read_text(encoding="utf-8")
    try:
        expected = reference_render(source, case, add_generation_prompt, bos, eos)
        ref_error = None
    except Exception as e:  # the template rejects this conversation: inferx must reject it too
        expected, ref_error = None, e
    got = inferx_render(tmp_path, template, case, add_generation_prompt, bos, eos)
    if ref_error is not None:
        assert got.returncode != 0, (
            f"jinja2 raised {type(ref_error).__name__}: {ref_error}, but inferx rendered:\n"
            + got.stdout.decode("utf-8", "replace")
        )
        if isinstance(ref_error, jinja2.exceptions.TemplateError) and type(ref_error) is jinja2.exceptions.TemplateError:
            assert str(ref_error) in got.stderr.decode("utf-8", "replace"), got.stderr.decode("utf-8", "replace")
        return
    assert got.returncode == 0, got.stderr.decode("utf-8", "replace")
    actual = got.stdout.decode("utf-8")
    if actual != expected:
        # Show where they part, which is what one needs to fix it.
        i = next((k for k, (a, b) in enumerate(zip(actual, expected)) if a != b), min(len(actual), len(expected)))
        pytest.fail(
            f"output differs at char {i}:\n  jinja2: {expected[max(0, i - 80):i + 80]!r}\n"
            f"  inferx: {actual[max(0, i - 80):i + 80]!r}"
        )


@pytest.mark.parametrize("template", TEMPLATES, ids=[t.stem for t in TEMPLATES])
def test_template_renders_most_cases(template):
    """Guards against a vacuous pass: jinja2 itself must render most conversations for each template."""
    if not TEMPLATES:
        pytest.skip(f"no chat templates under {TEMPLATE_DIR}")
    bos, eos = tokens_for(template)
    source = template.read_text(encoding="utf-8")
    ok = 0
    for case in CASES.values():
        try:
            reference_render(source, case, True, bos, eos)
            ok += 1
        except Exception:
            pass
    assert ok >= 4, f"{template.name}: jinja2 renders only {ok} of {len(CASES)} conversations"


def test_bad_files_are_named(tmp_path):
    """A directory or a missing file as --template / --messages is an error naming it (a directory read as an
    empty template before, and rendered nothing without a word)."""
    messages = tmp_path / "messages.json"
    messages.write_text(json.dumps([{"role": "user", "content": "hi"}]), encoding="utf-8")
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}", encoding="utf-8")

    def render(*args):
        return subprocess.run([INFERX_BIN, "chat-template", *args], capture_output=True, text=True, timeout=60)

    r = render("--template", str(template), "--messages", str(messages))
    assert r.returncode == 0 and r.stdout.startswith("hi"), r.stderr
    r = render("--template", str(tmp_path), "--messages", str(messages))
    assert r.returncode != 0 and f"{tmp_path}: the --template file is a directory" in r.stderr, r.stderr
    r = render("--template", str(template), "--messages", str(tmp_path))
    assert r.returncode != 0 and f"{tmp_path}: the --messages file is a directory" in r.stderr, r.stderr
    r = render("--template", str(tmp_path / "missing.jinja"), "--messages", str(messages))
    assert r.returncode != 0 and "missing.jinja: cannot open the --template file" in r.stderr, r.stderr
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000, encoding="utf-8")
    r = render("--template", str(template), "--messages", str(deep))
    assert r.returncode != 0 and "JSON nested deeper than 128 levels" in r.stderr, r.stderr


def test_messages_object_and_extra_variables(tmp_path):
    """--messages as an object: its keys besides messages / tools are template variables, --extra's replace
    them key by key, and either replaces a fixed variable of the same name (bos_token)."""
    if not os.access(INFERX_BIN, os.X_OK):
        pytest.skip(f"inferx binary not built: {INFERX_BIN} (set INFERX_BIN)")
    template = tmp_path / "t.jinja"
    template.write_text("{{ a }},{{ b }},{{ c }},{{ bos_token }},{{ tools | length }},{{ messages[0].content }}",
                        encoding="utf-8")
    messages = tmp_path / "messages.json"
    messages.write_text(json.dumps({"a": 1, "messages": [{"role": "user", "content": "hi"}], "b": "x",
                                    "tools": [WEATHER_TOOL], "bos_token": "<M>"}), encoding="utf-8")
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps({"b": "y", "c": 3}), encoding="utf-8")
    r = subprocess.run([INFERX_BIN, "chat-template", "--template", str(template), "--messages", str(messages),
                        "--extra", str(extra), "--bos", "<s>"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("1,y,3,<M>,1,hi"), r.stdout
