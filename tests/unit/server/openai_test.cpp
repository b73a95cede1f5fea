#include <gtest/gtest.h>

#include "server/auth.h"
#include "server/openai/api_error.h"
#include "server/openai/request.h"
#include "server/openai/response.h"
#include "server/sse.h"

namespace inferx::server {
namespace {

using nlohmann::json;

std::string param_of(const json& body, bool chat = false) {
  try {
    chat ? parse_chat_request(body) : parse_completion_request(body);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.body()["error"]["type"], "invalid_request_error");
    return e.param;
  }
  return "<accepted>";
}

TEST(OpenAIRequest, CompletionFields) {
  auto r = parse_completion_request(json::parse(R"({"model": "m", "prompt": "hi", "max_tokens": 5,
      "temperature": 0.5, "top_p": 0.9, "top_k": 7, "min_p": 0.1, "n": 2, "seed": 3, "stop": "x",
      "logprobs": 2, "presence_penalty": 1, "frequency_penalty": -1, "repetition_penalty": 1.1,
      "logit_bias": {"17": -100}, "ignore_eos": true, "user": "u", "stream": true,
      "stream_options": {"include_usage": true}})"));
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(*r.prompts[0].text, "hi");
  EXPECT_EQ(r.params.max_tokens, 5);
  EXPECT_FLOAT_EQ(r.params.temperature, 0.5f);
  EXPECT_EQ(r.params.top_k, 7);
  EXPECT_EQ(r.params.n, 2);
  EXPECT_EQ(*r.params.seed, 3u);
  EXPECT_EQ(r.params.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(r.params.logprobs, 2);
  ASSERT_EQ(r.params.logit_bias.size(), 1u);
  EXPECT_EQ(r.params.logit_bias[0].first, 17);
  EXPECT_TRUE(r.params.ignore_eos && r.stream && r.include_usage);
  EXPECT_EQ(r.user, "u");
}

TEST(OpenAIRequest, PromptForms) {
  auto prompts = [](const char* body) { return parse_completion_request(json::parse(body)).prompts; };
  auto one = prompts(R"({"model": "m", "prompt": [1, 2, 3]})");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_FALSE(one[0].text);
  EXPECT_EQ(one[0].ids, (std::vector<int32_t>{1, 2, 3}));
  one = prompts(R"({"model": "m", "prompt": ["one"]})");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(*one[0].text, "one");
  one = prompts(R"({"model": "m", "prompt": [[4, 5]]})");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].ids, (std::vector<int32_t>{4, 5}));
  // Batches of prompts, in order.
  auto many = prompts(R"({"model": "m", "prompt": ["a", "", "c"]})");
  ASSERT_EQ(many.size(), 3u);
  EXPECT_EQ(*many[0].text, "a");
  EXPECT_EQ(*many[1].text, "");
  EXPECT_EQ(*many[2].text, "c");
  many = prompts(R"({"model": "m", "prompt": [[1], [2, 3]]})");
  ASSERT_EQ(many.size(), 2u);
  EXPECT_EQ(many[1].ids, (std::vector<int32_t>{2, 3}));
  // Mixed or malformed batches name the element.
  EXPECT_EQ(param_of(json::parse(R"({"model": "m", "prompt": ["a", [1]]})")), "prompt[1]");
  EXPECT_EQ(param_of(json::parse(R"({"model": "m", "prompt": [[1], "a"]})")), "prompt[1]");
  EXPECT_EQ(param_of(json::parse(R"({"model": "m", "prompt": [[1], []]})")), "prompt[1]");
  EXPECT_EQ(param_of(json::parse(R"({"model": "m", "prompt": [[1], [-1]]})")), "prompt[1]");
  EXPECT_EQ(param_of(json::parse(R"({"model": "m", "prompt": [{"a": 1}]})")), "prompt[0]");
  EXPECT_EQ(param_of(json::parse(R"({"model": "m", "prompt": [-1]})")), "prompt");
  EXPECT_EQ(param_of(json::parse(R"({"model": "m", "prompt": []})")), "prompt");
  EXPECT_EQ(param_of(json::parse(R"({"model": "m"})")), "prompt");
  EXPECT_EQ(param_of(json::parse(R"({"prompt": "x"})")), "model");
  // Bounds: prompts, and prompts x n choices.
  json big = {{"model", "m"}, {"prompt", json::array()}};
  for (size_t i = 0; i <= kMaxPrompts; ++i) big["prompt"].push_back("x");
  EXPECT_EQ(param_of(big), "prompt");
  json wide = {{"model", "m"}, {"prompt", json::array({"a", "b", "c", "d", "e"})}, {"n", kMaxN}};
  EXPECT_EQ(param_of(wide), "<accepted>");  // 640 choices
  wide["prompt"] = json::array();
  for (int64_t i = 0; i <= kMaxChoices / kMaxN; ++i) wide["prompt"].push_back("x");
  EXPECT_EQ(param_of(wide), "n");
}

TEST(OpenAIRequest, Echo) {
  EXPECT_FALSE(parse_completion_request(json::parse(R"({"model": "m", "prompt": "a"})")).echo);
  EXPECT_TRUE(parse_completion_request(json::parse(R"({"model": "m", "prompt": "a", "echo": true})")).echo);
  // Echo with logprobs would need the prompt's logprobs, which are not computed: refused, not half-answered.
  EXPECT_EQ(param_of(json::parse(R"({"model": "m", "prompt": "a", "echo": true, "logprobs": 1})")), "echo");
  EXPECT_EQ(param_of(json::parse(R"({"model": "m", "prompt": "a", "echo": 1})")), "echo");
}

TEST(OpenAIRequest, InvalidFieldsNamed) {
  const json base = {{"model", "m"}, {"prompt", "p"}};
  const std::vector<std::pair<std::string, json>> bad = {{"temperature", 2.5},
                                                         {"temperature", "x"},
                                                         {"top_p", 0},
                                                         {"top_k", -2},
                                                         {"min_p", 2},
                                                         {"n", 0},
                                                         {"n", 1000},
                                                         {"max_tokens", 0},
                                                         {"max_tokens", 1.5},
                                                         {"seed", "s"},
                                                         {"stop", json::array({1})},
                                                         {"stop", json::array({""})},
                                                         {"logprobs", 21},
                                                         {"logit_bias", {{"a", 1}}},
                                                         {"logit_bias", {{"5", 200}}},
                                                         {"presence_penalty", -3},
                                                         {"frequency_penalty", 2.5},
                                                         {"stream", "yes"},
                                                         {"ignore_eos", 1},
                                                         {"stream_options", {{"include_usage", true}}},
                                                         {"best_of", 3},
                                                         {"echo", "yes"},
                                                         {"suffix", "s"}};
  for (const auto& [k, v] : bad) {
    json b = base;
    b[k] = v;
    EXPECT_EQ(param_of(b), k) << k << "=" << v.dump();
  }
  json nulls = base;
  nulls["temperature"] = nullptr;  // null means "not given"
  EXPECT_EQ(param_of(nulls), "<accepted>");
}

// Whatever nlohmann refuses is 400 invalid_json, including a number past double's range, which it reports as
// out_of_range rather than parse_error (found by fuzz_openai_request: it was a 500).
TEST(OpenAIRequest, BodiesThatAreNotJsonAre400) {
  const std::vector<std::string> bodies = {R"({"model": "m", "prompt": "p", "max_tokens": 1e999})",
                                           R"({"model": )", "{\"model\": \"\xff\"}", ""};
  for (const std::string& text : bodies) {
    try {
      parse_request_body(text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << text;
      EXPECT_EQ(e.code, "invalid_json") << text;
    }
  }
  EXPECT_EQ(parse_request_body(R"({"b": 1, "a": [2]})").begin().key(), "b");  // the client's key order
}

// Chat templates print tool schemas with tojson: their keys must reach the template in the client's order.
TEST(OpenAIRequest, ChatKeepsToolSchemaKeyOrder) {
  auto r = parse_chat_request(nlohmann::ordered_json::parse(R"({"model": "m",
      "messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                 "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}}}}}]})"));
  EXPECT_EQ(r.tools[0]["function"]["parameters"]["properties"].dump(),
            R"({"zeta":{"type":"string"},"alpha":{"type":"integer"}})");
}

TEST(OpenAIRequest, ChatFields) {
  auto r = parse_chat_request(json::parse(R"({"model": "m", "messages": [
      {"role": "system", "content": "s"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
      "max_tokens": 9, "max_completion_tokens": 4, "logprobs": true, "top_logprobs": 3})"));
  EXPECT_EQ(r.messages[1]["content"], "ab");
  EXPECT_EQ(r.params.max_tokens, 4);  // max_completion_tokens wins
  EXPECT_EQ(r.params.logprobs, 3);
  auto d =
      parse_chat_request(json::parse(R"({"model": "m", "messages": [{"role": "user", "content": "x"}]})"));
  EXPECT_EQ(d.params.max_tokens, 0);  // filled from the context later
  EXPECT_FALSE(d.max_tokens_given);
  EXPECT_EQ(param_of(json::parse(R"({"model": "m", "messages": []})"), true), "messages");
  EXPECT_EQ(param_of(json::parse(R"({"model": "m", "messages": [{"role": "bot", "content": "x"}]})"), true),
            "messages[0].role");
  EXPECT_EQ(param_of(json::parse(R"({"model": "m", "messages": [{"role": "user"}]})"), true),
            "messages[0].content");
  EXPECT_EQ(param_of(json::parse(R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
      "top_logprobs": 2})"),
                     true),
            "top_logprobs");
}

// What the server cannot honour is refused, naming the field, never silently ignored: schema keywords it
// does not enforce, forced calls with nothing to call, the deprecated functions API.
TEST(OpenAIRequest, UnhonourableFieldsRefused) {
  const json chat = {{"model", "m"}, {"messages", json::array({{{"role", "user"}, {"content", "x"}}})}};
  auto with = [&](const char* k, const json& v) {
    json b = chat;
    b[k] = v;
    return param_of(b, true);
  };
  EXPECT_EQ(with("response_format", {{"type", "text"}}), "<accepted>");
  EXPECT_EQ(with("response_format", nullptr), "<accepted>");
  EXPECT_EQ(with("response_format", {{"type", "json_object"}}), "<accepted>");  // JSON mode is enforced
  json json_mode = chat;
  json_mode["response_format"] = {{"type", "json_object"}};
  EXPECT_EQ(parse_chat_request(json_mode).response_format, ResponseFormat::JsonObject);
  EXPECT_EQ(parse_chat_request(chat).response_format, ResponseFormat::Text);
  json_mode["ignore_eos"] = true;  // nothing could end the reply after its object
  EXPECT_EQ(param_of(json_mode, true), "ignore_eos");
  EXPECT_EQ(with("response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}),
            "response_format");
  EXPECT_EQ(with("response_format", "json"), "response_format");
  json schema_mode = chat;  // the schema is compiled (and refused if it cannot be enforced) by the handler
  schema_mode["response_format"] = {{"type", "json_schema"},
                                    {"json_schema", {{"name", "x"}, {"schema", {{"type", "object"}}}}}};
  const ParsedRequest with_schema = parse_chat_request(schema_mode);
  EXPECT_EQ(with_schema.response_format, ResponseFormat::JsonSchema);
  EXPECT_EQ(with_schema.json_schema, json({{"type", "object"}}));
  EXPECT_EQ(with("tool_choice", "auto"), "<accepted>");
  EXPECT_EQ(with("tool_choice", "none"), "<accepted>");
  EXPECT_EQ(with("tool_choice", "required"), "tool_choice");  // no tools to call
  json with_tools = chat;
  with_tools["tools"] = json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
  with_tools["tool_choice"] = "required";
  EXPECT_EQ(parse_chat_request(with_tools).tool_choice, "required");
  with_tools["tool_choice"] = {{"type", "function"}, {"function", {{"name", "f"}}}};
  const ParsedRequest named = parse_chat_request(with_tools);
  EXPECT_EQ(named.tool_choice, "function");
  EXPECT_EQ(named.tool_choice_name, "f");
  with_tools["tool_choice"] = {{"type", "function"}, {"function", {{"name", "g"}}}};
  EXPECT_EQ(param_of(with_tools, true), "tool_choice");  // not among the tools
  with_tools["tool_choice"] = {{"type", "function"}, {"function", {{"name", 3}}}};
  EXPECT_EQ(param_of(with_tools, true), "tool_choice");
  EXPECT_EQ(with("tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}), "tool_choice");
  EXPECT_EQ(with("functions", json::array()), "functions");
  EXPECT_EQ(with("modalities", json::array({"text"})), "<accepted>");
  EXPECT_EQ(with("modalities", json::array({"text", "audio"})), "modalities");
  EXPECT_EQ(with("audio", {{"voice", "alloy"}, {"format", "wav"}}), "audio");
  EXPECT_EQ(with("web_search_options", json::object()), "web_search_options");
  EXPECT_TRUE(parse_chat_request(chat).parallel_tool_calls);
  json one_call = chat;
  one_call["parallel_tool_calls"] = false;
  EXPECT_FALSE(parse_chat_request(one_call).parallel_tool_calls);
  EXPECT_EQ(with("function_call", "auto"), "function_call");
  EXPECT_EQ(
      param_of(json::parse(R"({"model": "m", "prompt": "x", "response_format": {"type": "json_schema"}})")),
      "response_format");
}

TEST(OpenAIResponse, ChatStreamSequence) {
  ResponseContext ctx;
  ctx.chat = true;
  ctx.id = "chatcmpl-1";
  ctx.created = 42;
  ctx.model = "m";
  ctx.include_usage = true;
  StreamEncoder enc(ctx);
  RequestOutput o;
  o.deltas.push_back({0, {5}, "Hel", {}, FinishReason::None, ""});
  RequestOutput last;
  last.deltas.push_back({0, {6}, "lo", {}, FinishReason::Stop, ""});
  last.finished = true;
  last.prompt_tokens = 3;
  last.completion_tokens = 2;
  UsageCounts usage;
  usage.add(last);
  const std::string s = enc.begin() + enc.on_output(o) + enc.on_output(last) + enc.end(usage);
  const std::string common = R"("created":42,"id":"chatcmpl-1","model":"m","object":"chat.completion.chunk",)"
                             R"("system_fingerprint":null,)";
  EXPECT_EQ(
      s,
      "data: {\"choices\":[{\"delta\":{\"content\":\"\",\"role\":\"assistant\"},\"finish_reason\":null,"
      "\"index\":0,\"logprobs\":null}]," +
          common +
          "\"usage\":null}\n\n"
          "data: "
          "{\"choices\":[{\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null,\"index\":0,\"logprobs\":"
          "null}]," +
          common +
          "\"usage\":null}\n\n"
          "data: "
          "{\"choices\":[{\"delta\":{\"content\":\"lo\"},\"finish_reason\":null,\"index\":0,\"logprobs\":"
          "null}]," +
          common +
          "\"usage\":null}\n\n"
          "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\",\"index\":0,\"logprobs\":null}]," +
          common +
          "\"usage\":null}\n\n"
          "data: {\"choices\":[]," +
          common +
          "\"usage\":{\"completion_tokens\":2,\"prompt_tokens\":3,\"prompt_tokens_details\":{\"cached_"
          "tokens\":0},"
          "\"total_tokens\":5}}\n\n"
          "data: [DONE]\n\n");
}

TEST(OpenAIResponse, CompletionAccumulates) {
  ResponseContext ctx;
  ctx.id = "cmpl-1";
  ctx.model = "m";
  ctx.n = 2;
  ResponseAccumulator acc(ctx);
  RequestOutput a;
  a.deltas.push_back({1, {1}, "b", {}, FinishReason::None, ""});
  a.deltas.push_back({0, {2}, "a", {}, FinishReason::Length, ""});
  RequestOutput b;
  b.deltas.push_back({1, {3}, "c", {}, FinishReason::Stop, ""});
  b.finished = true;
  b.prompt_tokens = 4;
  b.completion_tokens = 3;
  acc.on_output(a);
  acc.on_output(b);
  UsageCounts usage;
  usage.add(b);
  json r = acc.finish(usage);
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["choices"][0]["text"], "a");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["choices"][1]["text"], "bc");
  EXPECT_EQ(r["choices"][1]["finish_reason"], "stop");
  EXPECT_EQ(r["usage"]["total_tokens"], 7);
}

// Several prompts in one completions response: choices indexed prompt * n + j, each with its echo, usage
// summed over the prompts' engine requests.
TEST(OpenAIResponse, SeveralPromptsWithEcho) {
  ResponseContext ctx;
  ctx.id = "cmpl-2";
  ctx.model = "m";
  ctx.n = 4;  // 2 prompts x n = 2
  ctx.echo = {"A", "A", "B", "B"};
  ResponseAccumulator acc(ctx);
  RequestOutput p0;  // prompt 0's request, indices already offset (0, 1)
  p0.deltas.push_back({0, {1}, "x", {}, FinishReason::Length, ""});
  p0.deltas.push_back({1, {2}, "y", {}, FinishReason::Stop, ""});
  p0.finished = true;
  p0.prompt_tokens = 2;
  p0.completion_tokens = 2;
  p0.cached_prompt_tokens = 1;
  RequestOutput p1;  // prompt 1's (2, 3)
  p1.deltas.push_back({3, {3}, "w", {}, FinishReason::Length, ""});
  p1.deltas.push_back({2, {4}, "z", {}, FinishReason::Length, ""});
  p1.finished = true;
  p1.prompt_tokens = 5;
  p1.completion_tokens = 2;
  acc.on_output(p1);
  acc.on_output(p0);
  UsageCounts usage;
  usage.add(p0);
  usage.add(p1);
  const json r = acc.finish(usage);
  ASSERT_EQ(r["choices"].size(), 4u);
  const std::vector<std::string> texts = {"Ax", "Ay", "Bz", "Bw"};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(r["choices"][i]["index"], i);
    EXPECT_EQ(r["choices"][i]["text"], texts[i]);
  }
  EXPECT_EQ(r["usage"]["prompt_tokens"], 7);
  EXPECT_EQ(r["usage"]["completion_tokens"], 4);
  EXPECT_EQ(r["usage"]["total_tokens"], 11);
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 1);

  // Streaming: begin() writes each choice's echo as its first chunk; chat writes role chunks instead.
  ctx.include_usage = true;
  StreamEncoder enc(ctx);
  std::vector<json> chunks;
  const std::string s = enc.begin() + enc.on_output(p0) + enc.end(usage);
  for (size_t at = 0; (at = s.find("data: ", at)) != std::string::npos;) {
    const size_t stop = s.find("\n\n", at);
    const std::string data = s.substr(at + 6, stop - at - 6);
    if (data != "[DONE]") chunks.push_back(json::parse(data));
    at = stop;
  }
  ASSERT_GE(chunks.size(), 5u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(chunks[i]["choices"][0]["index"], i);
    EXPECT_EQ(chunks[i]["choices"][0]["text"], ctx.echo[i]);
  }
  EXPECT_EQ(chunks.back()["usage"]["total_tokens"], 11);
}

TEST(Sse, Framing) {
  EXPECT_EQ(sse_event("{}"), "data: {}\n\n");
  EXPECT_EQ(sse_event("a\nb"), "data: a\ndata: b\n\n");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
}

TEST(Auth, Bearer) {
  HttpRequest r;
  EXPECT_TRUE(is_authorized(r, ""));
  EXPECT_FALSE(is_authorized(r, "k"));
  r.headers["authorization"] = "Bearer k";
  EXPECT_TRUE(is_authorized(r, "k"));
  EXPECT_FALSE(is_authorized(r, "kk"));
  r.headers["authorization"] = "Bearer kx";
  EXPECT_FALSE(is_authorized(r, "k"));
  r.headers["authorization"] = "Basic k";
  EXPECT_FALSE(is_authorized(r, "k"));
}

}  // namespace
}  // namespace inferx::server
