// inferx: one binary, one sub-command per file (cli/<name>.cpp registers itself in commands.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"InferX: a fast LLM inference engine"};
  app.require_subcommand(1);
  inferx::cli::register_all(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    inferx::cli::run_selected(app);
  } catch (const inferx::Error& e) {
    std::fprintf(stderr, "inferx: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "inferx: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
