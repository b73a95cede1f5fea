#include "cli/commands.h"

namespace inferx::cli {

namespace {
std::vector<std::pair<CLI::App*, Action>>& registry() {
  static std::vector<std::pair<CLI::App*, Action>> r;
  return r;
}
}  // namespace

void register_all(CLI::App& app) { register_generate(app, registry()); }

void run_selected(CLI::App& app) {
  for (auto& [sub, action] : registry())
    if (sub->parsed()) action();
}

}  // namespace inferx::cli
