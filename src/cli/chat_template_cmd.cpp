// inferx chat-template: render a conversation with a model's chat template (or a template file) and print
// the prompt text exactly as transformers' apply_chat_template(..., tokenize=False) would.
#include <cstdio>
#include <ctime>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "core/text_file.h"
#include "formats/json_text.h"
#include "text/chat_template.h"
#include "text/tokenizer_loader.h"

namespace inferx::cli {

namespace {

struct ChatTemplateArgs {
  std::string model;
  std::string messages;
  std::string tools;
  std::string template_file;
  std::string extra;
  std::string bos, eos;
  bool bos_set = false, eos_set = false;
  std::string date;
  bool add_generation_prompt = false;
};

std::string read_text(const std::string& path, const char* what) {
  return read_text_file(path, fmt::format("the {} file", what));
}

nlohmann::ordered_json read_json(const std::string& path, const char* what) {
  // The server's request bound: the template's JSON conversion recurses per level.
  return parse_ordered_json_text(read_text(path, what), fmt::format("{}: {}", what, path), 128);
}

// "YYYY-MM-DD" -> seconds since the epoch at 00:00 UTC (days_from_civil, H. Hinnant's algorithm).
int64_t parse_date(const std::string& s) {
  int y = 0, m = 0, d = 0;
  char tail = 0;
  INFERX_CHECK(std::sscanf(s.c_str(), "%d-%d-%d%c", &y, &m, &d, &tail) == 3 && m >= 1 && m <= 12 && d >= 1 &&
                   d <= 31 && y >= 1970 && y <= 9999,
               "--date: expected YYYY-MM-DD, got '{}'", s);
  y -= m <= 2;
  const int era = y / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = static_cast<unsigned>((153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1);
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  const int64_t days = static_cast<int64_t>(era) * 146097 + static_cast<int64_t>(doe) - 719468;
  return days * 86400;
}

using JsonMembers = std::vector<nlohmann::ordered_json::object_t::value_type>;  // ordered_map's base

// dst[key] = value for every member of src (a JSON object), in src's order after dst's own keys - as
// ordered_json's operator[] would, without its linear search per key (a --extra file of 200k keys took
// minutes that way).
void merge_object(nlohmann::ordered_json& dst, const nlohmann::ordered_json& src) {
  JsonMembers& members = dst.get_ref<nlohmann::ordered_json::object_t&>();
  std::unordered_map<std::string, size_t> at;
  at.reserve(members.size() + src.size());
  for (size_t i = 0; i < members.size(); ++i) at.emplace(members[i].first, i);
  for (auto it = src.begin(); it != src.end(); ++it) {
    const auto [pos, added] = at.try_emplace(it.key(), members.size());
    if (added)
      members.emplace_back(it.key(), it.value());
    else
      members[pos->second].second = it.value();
  }
}

void run_chat_template(const ChatTemplateArgs& a) {
  ChatTemplateInputs in;
  nlohmann::ordered_json msgs = read_json(a.messages, "--messages");
  if (msgs.is_object()) {  // {"messages": [...], "tools": [...], ...extra variables}
    INFERX_CHECK(msgs.contains("messages"), "--messages: {} is an object without a \"messages\" array",
                 a.messages);
    // in.extra is still empty and one parsed object's keys are unique: appended as they come.
    JsonMembers& own_extra = in.extra.get_ref<nlohmann::ordered_json::object_t&>();
    for (auto it = msgs.begin(); it != msgs.end(); ++it) {
      if (it.key() == "messages")
        in.messages = it.value();
      else if (it.key() == "tools")
        in.tools = it.value();
      else
        own_extra.emplace_back(it.key(), it.value());
    }
  } else {
    in.messages = std::move(msgs);
  }
  INFERX_CHECK(in.messages.is_array(), "--messages: {} must hold a JSON array of messages", a.messages);
  if (!a.tools.empty()) in.tools = read_json(a.tools, "--tools");
  if (!a.extra.empty()) {
    nlohmann::ordered_json extra = read_json(a.extra, "--extra");
    INFERX_CHECK(extra.is_object(), "--extra: {} must hold a JSON object", a.extra);
    merge_object(in.extra, extra);
  }
  in.add_generation_prompt = a.add_generation_prompt;
  if (!a.date.empty()) in.now_unix = parse_date(a.date);

  std::string source, name;
  if (!a.model.empty()) {
    ModelText text = load_model_text(a.model);
    if (text.chat_template) {
      source = *text.chat_template;
      name = a.model + ":chat_template";
    }
    if (text.tokenizer) {
      if (text.tokenizer->bos_id() >= 0) in.bos_token = text.tokenizer->piece(text.tokenizer->bos_id());
      if (text.tokenizer->eos_id() >= 0) in.eos_token = text.tokenizer->piece(text.tokenizer->eos_id());
    }
  }
  if (!a.template_file.empty()) {
    source = read_text(a.template_file, "--template");
    name = a.template_file;
  }
  INFERX_CHECK(!name.empty(), "no chat template: {} ships none; give one with --template FILE.jinja",
               a.model.empty() ? std::string("no --model given and it") : a.model);
  if (a.bos_set) in.bos_token = a.bos;
  if (a.eos_set) in.eos_token = a.eos;

  ChatTemplate tmpl(source, name);
  std::string out = tmpl.render(in);
  std::fwrite(out.data(), 1, out.size(), stdout);
}

}  // namespace

void register_chat_template(CLI::App& app, std::vector<std::pair<CLI::App*, Action>>& out) {
  auto args = std::make_shared<ChatTemplateArgs>();
  CLI::App* sub = app.add_subcommand("chat-template", "Render a conversation with a model's chat template");
  sub->add_option("--model", args->model, "GGUF file or Hugging Face model folder (for its chat template)");
  sub->add_option(
         "--messages", args->messages,
         "JSON file: an array of messages, or an object with \"messages\" (and \"tools\", other variables)")
      ->required();
  sub->add_option("--tools", args->tools, "JSON file with the tool definitions");
  sub->add_option("--template", args->template_file, "Jinja template file (overrides the model's)");
  sub->add_option("--extra", args->extra, "JSON file with more template variables (e.g. enable_thinking)");
  sub->add_option("--bos", args->bos, "bos_token text (default: the model tokenizer's)")
      ->each([args](const std::string&) { args->bos_set = true; });
  sub->add_option("--eos", args->eos, "eos_token text (default: the model tokenizer's)")
      ->each([args](const std::string&) { args->eos_set = true; });
  sub->add_option("--date", args->date,
                  "Fixed date YYYY-MM-DD for strftime_now (default: today, local time)");
  sub->add_flag("--add-generation-prompt", args->add_generation_prompt, "End with the assistant turn header");
  out.emplace_back(sub, [args] { run_chat_template(*args); });
}

}  // namespace inferx::cli
