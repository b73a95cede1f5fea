// inferx tokenize / inferx detokenize: text <-> token ids with a model's own tokenizer (GGUF metadata, a
// Hugging Face folder, or a tokenizer.json), for checking prompts and comparing with other engines.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "core/text_file.h"
#include "text/bpe_tokenizer.h"
#include "text/tokenizer_loader.h"

namespace inferx::cli {
namespace {

struct TokenizeArgs {
  std::string model;
  std::string text;
  std::string file;
  std::string jsonl;
  bool ids = false;
  bool pieces = false;
  bool no_special = false;
};

struct DetokenizeArgs {
  std::string model;
  std::vector<std::string> ids;
  std::string jsonl;
  bool keep_special = false;
};

// The tokenizer of a .gguf file, a Hugging Face folder or a tokenizer.json.
ModelText open_model_text(const std::string& model) {
  ModelText text = load_model_text(model);
  INFERX_CHECK(
      text.tokenizer != nullptr,
      "{}: no tokenizer found (give a .gguf with tokenizer.ggml.* metadata, a Hugging Face folder with "
      "tokenizer.json, or a tokenizer.json file)",
      model);
  return text;
}

std::string read_all(const std::string& path) {
  if (path == "-") {
    std::stringstream ss;
    ss << std::cin.rdbuf();
    return ss.str();
  }
  return read_text_file(path, "the file");
}

void print_ids(const std::vector<int32_t>& ids) {
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
  std::printf("%s\n", line.c_str());
}

void print_tokens(const Tokenizer& tok, const std::vector<int32_t>& ids, bool ids_too) {
  for (int32_t id : ids) {
    const std::string piece =
        nlohmann::json(tok.piece(id)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (ids_too) {
      std::printf("%d\t%s\n", id, piece.c_str());
    } else {
      std::printf("%s\n", piece.c_str());
    }
  }
}

void run_tokenize(const TokenizeArgs& a) {
  const ModelText mt = open_model_text(a.model);
  const Tokenizer& tok = *mt.tokenizer;
  const bool add_special = !a.no_special && mt.add_bos;
  if (!a.jsonl.empty()) {
    // One JSON string per line in, one line of ids per line out (for batch comparisons).
    std::istringstream lines(read_all(a.jsonl));
    std::string line;
    for (size_t n = 1; std::getline(lines, line); ++n) {
      if (line.empty()) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        fail("{}:{}: not a JSON string: {}", a.jsonl, n, e.what());
      }
      INFERX_CHECK(j.is_string(), "{}:{}: expected a JSON string", a.jsonl, n);
      print_ids(tok.encode(j.get<std::string>(), add_special));
    }
    return;
  }
  INFERX_CHECK(a.file.empty() || a.text.empty(),
               "give the text either as an argument or with --file, not both");
  const std::string text = a.file.empty() ? a.text : read_all(a.file);
  const auto ids = tok.encode(text, add_special);
  if (a.ids && !a.pieces) {
    print_ids(ids);
  } else {
    print_tokens(tok, ids, !a.pieces || a.ids);
  }
}

std::string decode_ids(const ModelText& mt, const std::vector<int32_t>& ids, bool keep_special) {
  if (auto* bpe = dynamic_cast<const BpeTokenizer*>(mt.tokenizer.get()))
    return bpe->decode(ids, !keep_special);
  if (!keep_special) return mt.tokenizer->decode(ids);
  std::string text;
  for (int32_t id : ids) {
    const TokenType t = mt.tokenizer->token_type(id);
    text += t == TokenType::Control ? mt.tokenizer->piece(id) : mt.tokenizer->decode({id});
  }
  return text;
}

void run_detokenize(const DetokenizeArgs& a) {
  const ModelText mt = open_model_text(a.model);
  if (!a.jsonl.empty()) {
    // One JSON array of ids per line in, one JSON string per line out.
    std::istringstream lines(read_all(a.jsonl));
    std::string line;
    for (size_t n = 1; std::getline(lines, line); ++n) {
      if (line.empty()) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        fail("{}:{}: not a JSON array: {}", a.jsonl, n, e.what());
      }
      INFERX_CHECK(j.is_array(), "{}:{}: expected a JSON array of ids", a.jsonl, n);
      const std::string text = decode_ids(mt, j.get<std::vector<int32_t>>(), a.keep_special);
      std::printf(
          "%s\n",
          nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    }
    return;
  }
  std::vector<int32_t> ids;
  for (const std::string& arg : a.ids) {
    std::stringstream ss(arg);
    for (std::string item; std::getline(ss, item, ',');) {
      if (item.empty()) continue;
      size_t used = 0;
      long long v = 0;
      try {
        v = std::stoll(item, &used);
      } catch (const std::logic_error&) {
        used = 0;
      }
      INFERX_CHECK(used == item.size() && v >= INT32_MIN && v <= INT32_MAX,
                   "detokenize: '{}' is not a token id", item);
      ids.push_back(static_cast<int32_t>(v));
    }
  }
  const std::string text = decode_ids(mt, ids, a.keep_special);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::printf("\n");
}

}  // namespace

void register_tokenize(CLI::App& app, std::vector<std::pair<CLI::App*, Action>>& out) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* sub = app.add_subcommand("tokenize", "Print the token ids (and pieces) of a text");
  sub->add_option("-m,--model", args->model, "A .gguf file, a Hugging Face folder, or a tokenizer.json")
      ->required();
  sub->add_option("text", args->text, "Text to tokenize (invalid UTF-8 becomes U+FFFD first)");
  sub->add_option("-f,--file", args->file, "Read the text from a file ('-': stdin)");
  sub->add_option("--jsonl", args->jsonl,
                  "Tokenize every line of a file, each a JSON string; one line of ids each");
  sub->add_flag("--ids", args->ids, "Print only the ids, on one line");
  sub->add_flag("--pieces", args->pieces, "Print only the pieces (JSON strings), one per line");
  sub->add_flag("--no-special", args->no_special, "Do not add the BOS/EOS the tokenizer adds by default");
  out.emplace_back(sub, [args] { run_tokenize(*args); });
}

void register_detokenize(CLI::App& app, std::vector<std::pair<CLI::App*, Action>>& out) {
  auto args = std::make_shared<DetokenizeArgs>();
  CLI::App* sub = app.add_subcommand("detokenize", "Print the text of token ids");
  sub->add_option("-m,--model", args->model, "A .gguf file, a Hugging Face folder, or a tokenizer.json")
      ->required();
  sub->add_option("ids", args->ids, "Token ids (separated by spaces or commas)");
  sub->add_option("--jsonl", args->jsonl,
                  "Decode every line of a file, each a JSON array of ids; one JSON string each");
  sub->add_flag("--keep-special", args->keep_special, "Show special tokens instead of skipping them");
  out.emplace_back(sub, [args] { run_detokenize(*args); });
}

}  // namespace inferx::cli
