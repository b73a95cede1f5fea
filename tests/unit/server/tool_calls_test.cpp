// Tool calls parsed from chat replies (server/openai/tool_calls.h) and how responses carry them.
#include "server/openai/tool_calls.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/openai/response.h"

namespace inferx::server {
namespace {

using nlohmann::json;

TEST(ToolCalls, FormatNames) {
  EXPECT_EQ(tool_call_format_from_name("hermes"), ToolCallFormat::Hermes);
  EXPECT_EQ(tool_call_format_from_name("llama3_json"), ToolCallFormat::Llama3Json);
  EXPECT_EQ(tool_call_format_from_name("mistral"), ToolCallFormat::Mistral);
  EXPECT_FALSE(tool_call_format_from_name("pythonic"));
}

TEST(ToolCalls, Hermes) {
  const ParsedReply r =
      parse_tool_calls(ToolCallFormat::Hermes,
                       "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                       "\"Paris\", \"days\": 2}}\n"
                       "</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.content, "Let me check.");
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(r.calls[0].arguments), json::parse(R"({"city": "Paris", "days": 2})"));
  EXPECT_EQ(r.calls[1].name, "now");
  EXPECT_EQ(r.calls[1].arguments, "{}");
  EXPECT_EQ(r.calls[0].id.rfind("call_", 0), 0u);
  EXPECT_NE(r.calls[0].id, r.calls[1].id);
  // Arguments written as a JSON string are passed through as that string.
  const ParsedReply s = parse_tool_calls(ToolCallFormat::Hermes,
                                         R"(<tool_call>{"name": "f", "arguments": "{\"a\":1}"}</tool_call>)");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].arguments, R"({"a":1})");
  EXPECT_EQ(s.content, "");
  // A call cut off after its JSON (max_tokens inside the closing tag) still counts, not other trailing text.
  EXPECT_EQ(
      parse_tool_calls(ToolCallFormat::Hermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_")
          .calls.size(),
      1u);
  EXPECT_TRUE(parse_tool_calls(ToolCallFormat::Hermes, "<tool_call>{\"name\": \"f\", \"arguments\": {}} <b>")
                  .calls.empty());
  EXPECT_EQ(
      parse_tool_calls(ToolCallFormat::Hermes, R"(<tool_call>{"name": "f", "arguments": {}})").calls.size(),
      1u);
}

TEST(ToolCalls, WhatDoesNotParseStaysContent) {
  for (const char* text : {"<tool_call>{\"name\": \"f\", \"arguments\": {</tool_call>",  // broken JSON
                           "<tool_call>{\"arguments\": {}}</tool_call>",                 // no name
                           "<tool_call>[1, 2]</tool_call>", "plain text with no call",
                           "<tool_call>{\"name\": \"f\", \"arguments\": 5}</tool_call>"}) {
    const ParsedReply r = parse_tool_calls(ToolCallFormat::Hermes, text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
  EXPECT_TRUE(
      parse_tool_calls(ToolCallFormat::None, "<tool_call>{\"name\": \"f\"}</tool_call>").calls.empty());
}

TEST(ToolCalls, Llama3Json) {
  ParsedReply r = parse_tool_calls(ToolCallFormat::Llama3Json,
                                   R"( {"name": "get_weather", "parameters": {"city": "a;b"}} )");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(json::parse(r.calls[0].arguments)["city"], "a;b");  // a ';' inside a string does not split
  r = parse_tool_calls(
      ToolCallFormat::Llama3Json,
      R"(<|python_tag|>{"name": "f", "parameters": {}}; {"name": "g", "arguments": {"x": 1}})");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[1].name, "g");
  EXPECT_TRUE(parse_tool_calls(ToolCallFormat::Llama3Json, "The answer is {not json}").calls.empty());
  EXPECT_TRUE(parse_tool_calls(ToolCallFormat::Llama3Json, R"({"name": "f"} trailing)").calls.empty());
}

TEST(ToolCalls, Mistral) {
  const ParsedReply r = parse_tool_calls(
      ToolCallFormat::Mistral,
      R"(Sure. [TOOL_CALLS] [{"name": "f", "arguments": {"q": "x"}}, {"name": "g", "arguments": {}}])");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.content, "Sure.");
  EXPECT_EQ(json::parse(r.calls[0].arguments)["q"], "x");
  EXPECT_TRUE(parse_tool_calls(ToolCallFormat::Mistral, "[TOOL_CALLS] [{\"name\": ").calls.empty());
}

// Streaming: whatever the deltas' boundaries, content before a call streams, the call is held and parsed at
// the end, and a reply without a call streams whole.
TEST(ToolCalls, StreamSplitsAnywhere) {
  const std::string reply = "Checking<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>";
  for (size_t cut = 1; cut < 20; ++cut) {
    ToolCallStream stream(ToolCallFormat::Hermes);
    std::string streamed;
    for (size_t at = 0; at < reply.size(); at += cut) streamed += stream.feed(reply.substr(at, cut));
    const ParsedReply end = stream.finish();
    EXPECT_EQ(streamed + end.content, "Checking") << cut;
    ASSERT_EQ(end.calls.size(), 1u) << cut;
    EXPECT_EQ(end.calls[0].name, "f");
  }
  const std::string text = "a < b and <tool but no call";
  for (ToolCallFormat f : {ToolCallFormat::Hermes, ToolCallFormat::Llama3Json, ToolCallFormat::Mistral}) {
    ToolCallStream stream(f);
    std::string streamed;
    for (char c : text) streamed += stream.feed(std::string(1, c));
    const ParsedReply end = stream.finish();
    EXPECT_TRUE(end.calls.empty());
    EXPECT_EQ(streamed + end.content, text);
  }
  ToolCallStream llama(ToolCallFormat::Llama3Json);
  std::string streamed = llama.feed("  <|python");
  streamed += llama.feed("_tag|>{\"name\": \"f\", \"parameters\": {}}");
  EXPECT_EQ(streamed, "");
  EXPECT_EQ(llama.finish().calls.size(), 1u);
}

RequestOutput final_output(const std::string& text) {
  RequestOutput o;
  o.deltas.push_back({0, {1}, text, {}, FinishReason::Stop, ""});
  o.finished = true;
  o.prompt_tokens = 3;
  o.completion_tokens = 5;
  return o;
}

TEST(ToolCalls, ChatResponseCarriesThem) {
  ResponseContext ctx;
  ctx.chat = true;
  ctx.id = "chatcmpl-1";
  ctx.model = "m";
  ctx.tool_format = ToolCallFormat::Hermes;
  const RequestOutput o = final_output("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>");
  UsageCounts usage;
  usage.add(o);

  ResponseAccumulator acc(ctx);
  acc.on_output(o);
  const json r = acc.finish(usage);
  const json& choice = r["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(choice["message"]["tool_calls"][0]["type"], "function");
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["arguments"], R"({"a":1})");

  StreamEncoder enc(ctx);
  const std::string s = enc.begin() + enc.on_output(o) + enc.end(usage);
  std::vector<json> chunks;
  for (size_t at = 0; (at = s.find("data: ", at)) != std::string::npos;) {
    const size_t stop = s.find("\n\n", at);
    const std::string data = s.substr(at + 6, stop - at - 6);
    if (data != "[DONE]") chunks.push_back(json::parse(data));
    at = stop;
  }
  bool saw_call = false;
  for (const json& c : chunks) {
    const json& d = c["choices"][0]["delta"];
    if (d.contains("content")) {
      EXPECT_EQ(d["content"], "") << c.dump();  // the call never leaks as text
    }
    if (d.contains("tool_calls")) {
      saw_call = true;
      EXPECT_EQ(d["tool_calls"][0]["index"], 0);
      EXPECT_EQ(d["tool_calls"][0]["function"]["name"], "f");
    }
  }
  EXPECT_TRUE(saw_call);
  EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"], "tool_calls");

  // parallel_tool_calls false: only the reply's first call, streamed or not.
  const RequestOutput two = final_output(
      "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>"
      "<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>");
  ResponseAccumulator both(ctx);
  both.on_output(two);
  EXPECT_EQ(both.finish(usage)["choices"][0]["message"]["tool_calls"].size(), 2u);
  ctx.parallel_tool_calls = false;
  ResponseAccumulator first(ctx);
  first.on_output(two);
  const json one = first.finish(usage)["choices"][0]["message"]["tool_calls"];
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0]["function"]["name"], "f");
  StreamEncoder first_streamed(ctx);
  const std::string streamed = first_streamed.on_output(two);
  EXPECT_NE(streamed.find("\"name\":\"f\""), std::string::npos);
  EXPECT_EQ(streamed.find("\"name\":\"g\""), std::string::npos);
  ctx.parallel_tool_calls = true;

  // Without a format (no --tool-call-parser, or no tools in the request) the reply is content.
  ctx.tool_format = ToolCallFormat::None;
  ResponseAccumulator plain(ctx);
  plain.on_output(o);
  EXPECT_EQ(plain.finish(usage)["choices"][0]["finish_reason"], "stop");
}

}  // namespace
}  // namespace inferx::server
