// Hugging Face tokenizer files -> BpeTokenizer (see hf_tokenizer_json.h). Field names and defaults follow
// the serde definitions of tokenizers (tokenizers/src/models/bpe/serialization.rs,
// tokenizer/serialization.rs, processors/template.rs) and transformers' tokenization_utils_fast.py.
#include "text/hf_tokenizer_json.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "core/text_file.h"
#include "formats/json_text.h"

namespace inferx {
namespace {

using nlohmann::json;

std::string read_text(const std::string& path) { return read_text_file(path, "the file"); }

json read_json(const std::string& path) { return parse_json_text(read_text(path), path); }

// A token id field: an integer in [0, INT32_MAX) (the tokenizer checks it against the vocabulary later).
int32_t token_id(const json& v, std::string_view what, const std::string& source) {
  return static_cast<int32_t>(json_integer(v, what, source, 0, INT32_MAX - 1));
}

// A transformers special-token value: "<s>" or {"content": "<s>", ...}.
std::string token_content(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return {};
}

std::pair<std::string, std::string> split_merge(const json& m, size_t rank, const std::string& source) {
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) return {m[0], m[1]};
  INFERX_CHECK(m.is_string(), "{}: model.merges[{}] must be \"a b\" or [\"a\", \"b\"]", source, rank);
  const std::string s = m.get<std::string>();
  const size_t space = s.find(' ');
  // tokenizers requires exactly two space-separated parts.
  INFERX_CHECK(space != std::string::npos && s.find(' ', space + 1) == std::string::npos,
               "{}: model.merges[{}] '{}' is not two tokens separated by one space", source, rank, s);
  return {s.substr(0, space), s.substr(space + 1)};
}

// The special tokens a post-processor adds around one sequence.
void parse_post_processor(const json& pp, BpeSpec& spec, const std::string& source) {
  if (pp.is_null()) return;
  const std::string type = pp.value("type", std::string());
  if (type == "Sequence") {
    for (const json& p : pp.value("processors", json::array())) parse_post_processor(p, spec, source);
  } else if (type == "ByteLevel") {
    // Offsets only; no tokens.
  } else if (type == "TemplateProcessing") {
    const json& special = pp.value("special_tokens", json::object());
    bool after = false;
    for (const json& piece : pp.value("single", json::array())) {
      if (piece.contains("Sequence")) {
        after = true;
        continue;
      }
      INFERX_CHECK(piece.contains("SpecialToken"),
                   "{}: post_processor template piece must be Sequence or "
                   "SpecialToken",
                   source);
      const std::string name = piece["SpecialToken"].value("id", std::string());
      INFERX_CHECK(special.contains(name),
                   "{}: post_processor template uses special token '{}' that "
                   "special_tokens does not define",
                   source, name);
      for (const json& id : special[name].value("ids", json::array()))
        (after ? spec.suffix_ids : spec.prefix_ids)
            .push_back(token_id(id, "post_processor special token id", source));
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    // cls A sep, with [token, id] pairs.
    INFERX_CHECK(pp.contains("cls") && pp.contains("sep"), "{}: {} needs cls and sep", source, type);
    spec.prefix_ids.push_back(token_id(pp["cls"].at(1), "post_processor cls id", source));
    spec.suffix_ids.push_back(token_id(pp["sep"].at(1), "post_processor sep id", source));
  } else {
    fail(
        "{}: post_processor type '{}' is not supported (supported: TemplateProcessing, ByteLevel, "
        "RobertaProcessing, BertProcessing, Sequence)",
        source, type);
  }
}

int32_t find_token_id(const BpeSpec& spec, const std::string& content) {
  if (content.empty()) return -1;
  for (const AddedToken& t : spec.added_tokens)
    if (t.content == content) return t.id;
  for (size_t i = 0; i < spec.vocab.size(); ++i)
    if (spec.vocab[i] == content) return static_cast<int32_t>(i);
  return -1;
}

// BOS/EOS from tokenizer_config.json, and the add_bos_token/add_eos_token rebuild of the post-processor
// that transformers' Llama-family fast tokenizers do (update_post_processor).
void apply_config(const json& config, BpeSpec& spec) {
  if (!config.is_object()) return;
  if (config.contains("bos_token")) spec.bos_id = find_token_id(spec, token_content(config["bos_token"]));
  if (config.contains("eos_token")) spec.eos_id = find_token_id(spec, token_content(config["eos_token"]));
  // Ids from generation_config.json, for what the token names did not give.
  if (spec.bos_id < 0 && config.contains("bos_token_id"))
    spec.bos_id = token_id(config["bos_token_id"], "bos_token_id (generation_config.json)", spec.source);
  if (spec.eos_id < 0 && config.contains("eos_token_id"))
    spec.eos_id = token_id(config["eos_token_id"], "eos_token_id (generation_config.json)", spec.source);
  const std::string cls = config.value("tokenizer_class", std::string());
  const bool rebuilds =
      cls.rfind("Llama", 0) == 0 || cls.rfind("CodeLlama", 0) == 0 || cls.rfind("Gemma", 0) == 0;
  if (rebuilds && (config.contains("add_bos_token") || config.contains("add_eos_token"))) {
    const bool add_bos = config.value("add_bos_token", true);
    const bool add_eos = config.value("add_eos_token", false);
    spec.prefix_ids.clear();
    spec.suffix_ids.clear();
    if (add_bos && spec.bos_id >= 0) spec.prefix_ids.push_back(spec.bos_id);
    if (add_eos && spec.eos_id >= 0) spec.suffix_ids.push_back(spec.eos_id);
  }
}

std::vector<AddedToken> parse_added_tokens(const json& list, const std::string& source) {
  std::vector<AddedToken> out;
  if (list.is_null()) return out;
  INFERX_CHECK(list.is_array(), "{}: added_tokens must be an array", source);
  for (const json& t : list) {
    AddedToken a;
    INFERX_CHECK(t.contains("id") && t.contains("content"), "{}: added token without id or content", source);
    a.id = token_id(t["id"], "added token id", source);
    a.content = t["content"].get<std::string>();
    a.special = t.value("special", false);
    a.lstrip = t.value("lstrip", false);
    a.rstrip = t.value("rstrip", false);
    a.single_word = t.value("single_word", false);
    a.normalized = t.value("normalized", !a.special);
    out.push_back(std::move(a));
  }
  return out;
}

// tokenizers does not take an added token's "id" from the file: AddedVocabulary::add_tokens gives it the
// model's id when the content is in the vocabulary, else the next id after the vocabulary and the added
// tokens so far. Real files agree with that; a file that does not is read the way tokenizers reads it.
void assign_added_ids(BpeSpec& spec) {
  std::unordered_map<std::string_view, int32_t> model;
  int32_t model_size = 0;
  for (size_t i = 0; i < spec.vocab.size(); ++i) {
    if (spec.vocab[i].empty()) continue;
    model.emplace(spec.vocab[i], static_cast<int32_t>(i));
    ++model_size;
  }
  std::unordered_map<std::string, int32_t> added;
  int32_t max_added = -1;
  for (AddedToken& t : spec.added_tokens) {
    if (const auto it = added.find(t.content); it != added.end()) {
      t.id = it->second;
    } else if (const auto m = model.find(t.content); m != model.end()) {
      t.id = m->second;
    } else {
      t.id = max_added >= model_size ? max_added + 1 : model_size;
    }
    added.emplace(t.content, t.id);
    max_added = std::max(max_added, t.id);
  }
}

// Runs f, turning a JSON value of an unexpected type deep in a component (nlohmann's type_error,
// out_of_range, ...) into inferx::Error naming the file: a load error, not a crash (found by
// fuzz_hf_tokenizer_json: "type must be number, but is string").
template <class F>
auto checked_json(const std::string& source, F&& f) {
  try {
    return f();
  } catch (const json::exception& e) {
    fail("{}: unexpected JSON structure: {}", source, e.what());
  }
}

std::unique_ptr<BpeTokenizer> parse_unchecked(const json& doc, const std::string& source,
                                              const json& config) {
  INFERX_CHECK(doc.is_object() && doc.contains("model"), "{}: not a tokenizer.json (no 'model')", source);
  const json& model = doc["model"];
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") {
    fail("{}: tokenizer model type '{}' is not supported (only BPE: byte-level or SentencePiece-style)",
         source, type);
  }
  INFERX_CHECK(model.value("dropout", json()).is_null(), "{}: BPE dropout is not supported for inference",
               source);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json v = model.value(key, json());
    INFERX_CHECK(v.is_null() || v == "", "{}: BPE {} is not supported", source, key);
  }
  BpeSpec spec;
  spec.source = source;
  INFERX_CHECK(model.contains("vocab") && model["vocab"].is_object(), "{}: model.vocab must be an object",
               source);
  const size_t entries = model["vocab"].size();
  for (const auto& [tok, id_json] : model["vocab"].items()) {
    const int64_t id = json_integer(id_json, fmt::format("model.vocab['{}']", tok), source, 0, INT32_MAX - 1);
    INFERX_CHECK(id >= 0 && id < INT32_MAX && static_cast<size_t>(id) < max_token_ids(entries),
                 "{}: model.vocab['{}'] has id {}, out of range for {} entries", source, tok, id, entries);
    if (static_cast<size_t>(id) >= spec.vocab.size()) spec.vocab.resize(static_cast<size_t>(id) + 1);
    spec.vocab[static_cast<size_t>(id)] = tok;
  }
  const json& merges = model.value("merges", json::array());
  spec.merges.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) spec.merges.push_back(split_merge(merges[r], r, source));
  const json unk = model.value("unk_token", json());
  if (unk.is_string()) spec.unk_token = unk.get<std::string>();
  spec.byte_fallback = model.value("byte_fallback", false);
  spec.ignore_merges = model.value("ignore_merges", false);
  spec.fuse_unk = model.value("fuse_unk", false);
  spec.added_tokens = parse_added_tokens(doc.value("added_tokens", json()), source);
  assign_added_ids(spec);
  spec.normalizer = Normalizer::from_json(doc.value("normalizer", json()), source);
  spec.pre_tokenizer = PreTokenizer::from_json(doc.value("pre_tokenizer", json()), source);
  spec.decoder = Decoder::from_json(doc.value("decoder", json()), source);
  parse_post_processor(doc.value("post_processor", json()), spec, source);
  apply_config(config, spec);
  return std::make_unique<BpeTokenizer>(std::move(spec));
}

}  // namespace

std::unique_ptr<BpeTokenizer> parse_hf_tokenizer_json(const json& doc, const std::string& source,
                                                      const json& config) {
  return checked_json(source, [&] { return parse_unchecked(doc, source, config); });
}

std::unique_ptr<BpeTokenizer> load_hf_tokenizer_json(const std::string& path, const json& config) {
  return parse_hf_tokenizer_json(read_json(path), path, config);
}

std::unique_ptr<BpeTokenizer> load_hf_vocab_merges(const std::string& vocab_path,
                                                   const std::string& merges_path, const json& pre_tokenizer,
                                                   bool ignore_merges, const json& config) {
  json doc;
  doc["model"] = {{"type", "BPE"}, {"vocab", read_json(vocab_path)}, {"ignore_merges", ignore_merges}};
  json merges = json::array();
  std::istringstream lines(read_text(merges_path));
  std::string line;
  for (bool first = true; std::getline(lines, line); first = false) {
    if (first && line.rfind("#version", 0) == 0) continue;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    merges.push_back(line);
  }
  doc["model"]["merges"] = std::move(merges);
  const bool prefix = config.is_object() && config.value("add_prefix_space", false);
  doc["pre_tokenizer"] = pre_tokenizer.is_null()
                             ? json{{"type", "ByteLevel"}, {"add_prefix_space", prefix}, {"use_regex", true}}
                             : pre_tokenizer;
  doc["decoder"] = {{"type", "ByteLevel"}};
  // The special tokens transformers knows from the config are added tokens of the vocabulary.
  json added = json::array();
  if (config.is_object()) {
    const json& vocab = doc["model"]["vocab"];
    std::vector<std::string> seen;
    for (const char* key : {"unk_token", "bos_token", "eos_token", "pad_token"}) {
      const std::string c = config.contains(key) ? token_content(config[key]) : std::string();
      if (c.empty() || !vocab.contains(c) || std::find(seen.begin(), seen.end(), c) != seen.end()) continue;
      seen.push_back(c);
      added.push_back({{"id", vocab[c]}, {"content", c}, {"special", true}, {"normalized", false}});
    }
  }
  doc["added_tokens"] = std::move(added);
  return parse_hf_tokenizer_json(doc, vocab_path, config);
}

namespace {

HfFolderText load_folder_unchecked(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path root(dir);
  json config = nullptr;
  if (fs::exists(root / "tokenizer_config.json"))
    config = read_json((root / "tokenizer_config.json").string());
  // special_tokens_map.json fills in the special tokens tokenizer_config.json does not name.
  if (fs::exists(root / "special_tokens_map.json")) {
    const json map = read_json((root / "special_tokens_map.json").string());
    if (!config.is_object()) config = json::object();
    for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"})
      if (!config.contains(key) && map.contains(key)) config[key] = map[key];
  }
  if (fs::exists(root / "generation_config.json")) {
    const json gen = read_json((root / "generation_config.json").string());
    if (!config.is_object()) config = json::object();
    for (const char* key : {"bos_token_id", "eos_token_id"}) {
      if (!gen.contains(key)) continue;
      const json& v = gen[key];  // an id or a list of ids (the first is the main one)
      if (v.is_number_integer()) config[key] = v;
      if (v.is_array() && !v.empty() && v[0].is_number_integer()) config[key] = v[0];
    }
  }
  HfFolderText out;
  if (fs::exists(root / "tokenizer.json")) {
    out.tokenizer = load_hf_tokenizer_json((root / "tokenizer.json").string(), config);
  } else if (fs::exists(root / "vocab.json") && fs::exists(root / "merges.txt")) {
    out.tokenizer = load_hf_vocab_merges((root / "vocab.json").string(), (root / "merges.txt").string(),
                                         nullptr, false, config);
  } else {
    fail("{}: no tokenizer.json (nor vocab.json + merges.txt) in this folder", dir);
  }
  if (config.is_object() && config.contains("chat_template")) {
    const json& t = config["chat_template"];
    if (t.is_string()) {
      out.chat_template = t.get<std::string>();
    } else if (t.is_array()) {
      // A list of {"name", "template"}: transformers uses the one named "default".
      for (const json& entry : t)
        if (entry.value("name", std::string()) == "default")
          out.chat_template = entry.value("template", std::string());
      if (!out.chat_template && !t.empty()) out.chat_template = t[0].value("template", std::string());
    }
  }
  if (!out.chat_template && fs::exists(root / "chat_template.jinja"))
    out.chat_template = read_text((root / "chat_template.jinja").string());
  return out;
}

}  // namespace

HfFolderText load_hf_folder_text(const std::string& dir) {
  return checked_json(dir, [&] { return load_folder_unchecked(dir); });
}

}  // namespace inferx
