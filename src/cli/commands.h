#pragma once
// Sub-command registry: each cli/<name>.cpp defines register_<name>(app) returning the sub-command and
// the action to run when it is selected.
#include <CLI/CLI.hpp>
#include <functional>

namespace inferx::cli {

using Action = std::function<void()>;

void register_generate(CLI::App& app, std::vector<std::pair<CLI::App*, Action>>& out);
void register_chat_template(CLI::App& app, std::vector<std::pair<CLI::App*, Action>>& out);
void register_tokenize(CLI::App& app, std::vector<std::pair<CLI::App*, Action>>& out);
void register_detokenize(CLI::App& app, std::vector<std::pair<CLI::App*, Action>>& out);
void register_serve(CLI::App& app, std::vector<std::pair<CLI::App*, Action>>& out);
void register_bench(CLI::App& app, std::vector<std::pair<CLI::App*, Action>>& out);
void register_perplexity(CLI::App& app, std::vector<std::pair<CLI::App*, Action>>& out);
void register_quantize(CLI::App& app, std::vector<std::pair<CLI::App*, Action>>& out);

void register_all(CLI::App& app);
void run_selected(CLI::App& app);

}  // namespace inferx::cli
