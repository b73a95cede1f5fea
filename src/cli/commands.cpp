#include "cli/commands.h"

namespace inferx::cli {

namespace {
std::vector<std::pair<CLI::App*, Action>>& registry() {
  static std::vector<std::pair<CLI::App*, Action>> r;
  return r;
}
}  // namespace

void register_all(CLI::App& app) {
  register_generate(app, registry());
  register_chat_template(app, registry());
  register_tokenize(app, registry());
  register_detokenize(app, registry());
  register_serve(app, registry());
  register_bench(app, registry());
  register_perplexity(app, registry());
  register_quantize(app, registry());
}

void run_selected(CLI::App& app) {
  for (auto& [sub, action] : registry())
    if (sub->parsed()) action();
}

}  // namespace inferx::cli
