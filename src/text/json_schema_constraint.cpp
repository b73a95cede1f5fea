#include "text/json_schema_constraint.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <unordered_map>

#include "core/error.h"

namespace inferx {

using ojson = nlohmann::ordered_json;
using namespace json_lexer;

// ---- Compiling the schema ----

namespace {

struct Compiler {
  const ojson& root;
  CompiledSchema out;
  std::map<std::string, int32_t> refs;  // "$ref" string -> node (allocated before its target compiles)

  int32_t add(SchemaNode n) {
    out.nodes.push_back(std::move(n));
    return static_cast<int32_t>(out.nodes.size()) - 1;
  }

  static std::string text(const ojson& v) { return v.dump(-1, ' ', false, ojson::error_handler_t::strict); }

  int32_t ref(const std::string& r) {
    auto it = refs.find(r);
    if (it != refs.end()) return it->second;
    const ojson* target = nullptr;
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      const std::string p = prefix;
      if (r.rfind(p, 0) != 0) continue;
      const std::string container = p.substr(2, p.size() - 3);
      const std::string name = r.substr(p.size());
      auto defs = root.find(container);
      if (defs != root.end() && defs->is_object() && defs->contains(name)) target = &(*defs)[name];
    }
    if (r == "#") target = &root;
    if (!target)
      throw SchemaError(fmt::format("'$ref' {} does not name a schema under #/$defs or #/definitions", r));
    // Allocate first, so a recursive reference finds it: an AnyOf of one option, filled in below.
    const int32_t slot = add({});
    refs[r] = slot;
    const int32_t target_node = node(*target);
    out.nodes[static_cast<size_t>(slot)].kind = SchemaNode::AnyOf;
    out.nodes[static_cast<size_t>(slot)].options = {target_node};
    return slot;
  }

  int32_t typed(const ojson& s, const std::string& type) {
    SchemaNode n;
    if (type == "string") {
      n.kind = SchemaNode::String;
    } else if (type == "number") {
      n.kind = SchemaNode::Number;
    } else if (type == "integer") {
      n.kind = SchemaNode::Integer;
    } else if (type == "boolean") {
      n.kind = SchemaNode::Literals;
      n.literals = {"true", "false"};
    } else if (type == "null") {
      n.kind = SchemaNode::Literals;
      n.literals = {"null"};
    } else if (type == "array") {
      auto items = s.find("items");
      n.items = items == s.end() ? -1 : node(*items);  // compiled first: node() may grow out.nodes
      n.kind = SchemaNode::Array;
    } else if (type == "object") {
      auto props = s.find("properties");
      if (props == s.end()) {
        n.kind = SchemaNode::AnyObject;  // an object without properties: any object (JSON mode's automaton)
        return add(std::move(n));
      }
      if (!props->is_object()) throw SchemaError("'properties' must be an object");
      if (props->size() > std::numeric_limits<uint16_t>::max()) throw SchemaError("too many 'properties'");
      std::vector<std::string> required;
      if (auto req = s.find("required"); req != s.end()) {
        if (!req->is_array()) throw SchemaError("'required' must be an array of property names");
        for (const auto& r : *req) {
          if (!r.is_string() || !props->contains(r.get<std::string>()))
            throw SchemaError(fmt::format("'required' names {}, which is not in 'properties'", r.dump()));
          required.push_back(r.get<std::string>());
        }
      }
      std::vector<std::pair<std::string, const ojson*>> members;
      for (const auto& [k, v] : props->items()) members.emplace_back(k, &v);
      SchemaNode o;
      o.kind = SchemaNode::Object;
      for (const auto& [k, v] : members) {
        o.keys.push_back(text(ojson(k)));
        o.required.push_back(std::find(required.begin(), required.end(), k) != required.end() ? 1 : 0);
        o.values.push_back(-1);
      }
      const int32_t id = add(std::move(o));
      for (size_t i = 0; i < members.size(); ++i) {
        const int32_t v = node(*members[i].second);
        out.nodes[static_cast<size_t>(id)].values[i] = v;
      }
      return id;
    } else {
      throw SchemaError(fmt::format("'type' {} is not a JSON Schema type", ojson(type).dump()));
    }
    return add(std::move(n));
  }

  int32_t node(const ojson& s) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) throw SchemaError("the schema 'false' allows no value");
      return add({});
    }
    if (!s.is_object()) throw SchemaError(fmt::format("a schema must be an object, got {}", s.dump()));
    static const char* const kKnown[] = {"type",    "properties",  "required", "additionalProperties",
                                         "items",   "enum",        "const",    "anyOf",
                                         "oneOf",   "$ref",        "$defs",    "definitions",
                                         "title",   "description", "default",  "examples",
                                         "$schema", "$id",         "$comment", "strict"};
    for (const auto& item : s.items()) {
      const std::string& k = item.key();  // (clang 14 cannot capture a structured binding)
      if (std::find_if(std::begin(kKnown), std::end(kKnown), [&](const char* x) { return k == x; }) ==
          std::end(kKnown))
        throw SchemaError(fmt::format("the schema keyword '{}' is not enforced by this server", k));
    }
    if (auto r = s.find("$ref"); r != s.end()) {
      if (!r->is_string()) throw SchemaError("'$ref' must be a string");
      for (const char* k : {"type", "properties", "items", "enum", "const", "anyOf", "oneOf"})
        if (s.contains(k)) throw SchemaError(fmt::format("'$ref' beside '{}' is not enforced", k));
      return ref(r->get<std::string>());
    }
    if (auto e = s.find("enum"); e != s.end()) {
      if (!e->is_array() || e->empty()) throw SchemaError("'enum' must be a non-empty array");
      if (e->size() > std::numeric_limits<uint16_t>::max()) throw SchemaError("too many 'enum' values");
      SchemaNode n;
      n.kind = SchemaNode::Literals;
      for (const auto& v : *e) n.literals.push_back(text(v));
      return add(std::move(n));
    }
    if (auto c = s.find("const"); c != s.end()) {
      SchemaNode n;
      n.kind = SchemaNode::Literals;
      n.literals = {text(*c)};
      return add(std::move(n));
    }
    for (const char* k : {"anyOf", "oneOf"}) {
      auto a = s.find(k);
      if (a == s.end()) continue;
      if (!a->is_array() || a->empty()) throw SchemaError(fmt::format("'{}' must be a non-empty array", k));
      if (s.contains("type")) throw SchemaError(fmt::format("'{}' beside 'type' is not enforced", k));
      std::vector<int32_t> options;
      for (const auto& o : *a) options.push_back(node(o));
      SchemaNode n;
      n.kind = SchemaNode::AnyOf;
      n.options = std::move(options);
      return add(std::move(n));
    }
    auto type = s.find("type");
    if (type == s.end()) {
      if (s.contains("properties") || s.contains("items"))
        throw SchemaError("'properties' or 'items' without a 'type' is not enforced");
      return add({});  // any value
    }
    if (type->is_string()) return typed(s, type->get<std::string>());
    if (!type->is_array() || type->empty()) throw SchemaError("'type' must be a type name or a list of them");
    std::vector<int32_t> options;
    for (const auto& t : *type) {
      if (!t.is_string()) throw SchemaError("'type' must be a type name or a list of them");
      options.push_back(typed(s, t.get<std::string>()));
    }
    SchemaNode n;
    n.kind = SchemaNode::AnyOf;
    n.options = std::move(options);
    return add(std::move(n));
  }
};

}  // namespace

namespace {

// A value must consume input before its schema refers to itself again: {"$ref": "#"} alone, or anyOf
// options that lead back to the same node, would send the automaton round forever.
void check_no_empty_cycles(const CompiledSchema& s) {
  std::vector<uint8_t> mark(s.nodes.size(), 0);  // 0 new, 1 on the path, 2 done
  std::function<void(int32_t)> visit = [&](int32_t i) {
    if (mark[static_cast<size_t>(i)] == 2) return;
    if (mark[static_cast<size_t>(i)] == 1)
      throw SchemaError("the schema refers to itself before any value is written ($ref or anyOf cycle)");
    mark[static_cast<size_t>(i)] = 1;
    const SchemaNode& n = s.nodes[static_cast<size_t>(i)];
    if (n.kind == SchemaNode::AnyOf)
      for (int32_t o : n.options) visit(o);
    if (n.kind == SchemaNode::Sequence) visit(n.options[0]);
    mark[static_cast<size_t>(i)] = 2;
  };
  for (size_t i = 0; i < s.nodes.size(); ++i) visit(static_cast<int32_t>(i));
}

}  // namespace

CompiledSchema CompiledSchema::wrap(CompiledSchema inner, const std::string& prefix,
                                    const std::string& suffix) {
  auto literal = [&](const std::string& text) {
    SchemaNode lit;
    lit.kind = SchemaNode::Literals;
    lit.literals = {text};
    inner.nodes.push_back(std::move(lit));
    return static_cast<int32_t>(inner.nodes.size()) - 1;
  };
  SchemaNode seq;
  seq.kind = SchemaNode::Sequence;
  if (!prefix.empty()) seq.options.push_back(literal(prefix));
  seq.options.push_back(inner.root);
  if (!suffix.empty()) seq.options.push_back(literal(suffix));
  inner.nodes.push_back(std::move(seq));
  inner.root = static_cast<int32_t>(inner.nodes.size()) - 1;
  check_no_empty_cycles(inner);
  return inner;
}

CompiledSchema CompiledSchema::compile(const ojson& schema) {
  Compiler c{schema, {}, {}};
  try {
    c.out.root = c.node(schema);
  } catch (const ojson::exception& e) {
    throw SchemaError(fmt::format("the schema cannot be compiled: {}", e.what()));
  }
  check_no_empty_cycles(c.out);
  return std::move(c.out);
}

// ---- The automaton: a set of deterministic threads, each a stack of frames ----

namespace {

enum FrameKind : uint8_t { FValue, FLiteral, FKey, FString, FNumber, FObject, FArray, FAny, FSeq };
enum ObjectState : uint8_t { OOpen, OKey, OColon, OValue, OAfter, OComma };
enum ArrayState : uint8_t { AOpen, AValue, AAfter, AComma };

struct Frame {
  uint8_t kind = FValue;
  uint8_t state = 0;    // object / array / string / number state
  uint8_t integer = 0;  // FNumber: an integer (no fraction or exponent)
  uint8_t pad = 0;
  uint16_t index = 0;  // FObject: the property being written or the next one; FLiteral / FKey: which literal
  uint16_t pos = 0;    // FLiteral / FKey: bytes matched
  int32_t node = -1;
  bool operator==(const Frame& o) const {
    return kind == o.kind && state == o.state && integer == o.integer && index == o.index && pos == o.pos &&
           node == o.node;
  }
};

struct Thread {
  std::vector<Frame> frames;
  JsonCursor any;  // the FAny frame's cursor (an FAny frame is always on top)
  uint8_t whitespace = 0;
  bool operator==(const Thread& o) const {
    return frames == o.frames && whitespace == o.whitespace && any.key_bits() == o.any.key_bits();
  }
};

constexpr size_t kMaxThreads = 64;  // more are dropped: fewer continuations allowed, never a wrong one

class Automaton {
 public:
  explicit Automaton(const CompiledSchema& s) : s_(s) {}

  Thread start() const {
    Thread t;
    Frame f;
    f.kind = FValue;
    f.node = s_.root;
    t.frames.push_back(f);
    return t;
  }

  // Every successor of `t` on byte b, appended to out.
  void step(Thread t, uint8_t b, std::vector<Thread>& out) const {
    if (t.frames.empty()) return;  // complete: only an end token may follow
    Frame& f = t.frames.back();
    const bool structural = f.kind == FValue || (f.kind == FObject && f.state != OValue && f.state != OKey) ||
                            (f.kind == FArray && f.state != AValue);
    if (structural && is_space(b)) {
      // A fixed text may begin with whitespace (wrap's "\n</tool_call>"): try it as the value's first byte
      // too.
      if (f.kind == FValue && starts_with_space(f.node)) value_start(t, b, out);
      if (!step_space(t.whitespace, b)) return;
      out.push_back(std::move(t));
      return;
    }
    if (f.kind != FAny) t.whitespace = 0;
    switch (f.kind) {
      case FValue:
        return value_start(std::move(t), b, out);
      case FLiteral:
      case FKey: {
        const std::string& lit = literal(f);
        if (f.pos >= lit.size() || static_cast<uint8_t>(lit[f.pos]) != b) return;
        if (++f.pos < lit.size()) {
          out.push_back(std::move(t));
          return;
        }
        if (f.kind == FKey) {
          t.frames.pop_back();
          t.frames.back().state = OColon;
          out.push_back(std::move(t));
          return;
        }
        return value_done(std::move(t), out);
      }
      case FString:
        switch (step_string(f.state, b)) {
          case StringStep::More:
            out.push_back(std::move(t));
            return;
          case StringStep::Closed:
            return value_done(std::move(t), out);
          case StringStep::Invalid:
            return;
        }
        return;
      case FNumber:
        return number(std::move(t), b, out);
      case FObject:
        return object(std::move(t), b, out);
      case FArray:
        return array(std::move(t), b, out);
      case FAny: {
        JsonCursor next = t.any;
        if (next.step(b)) {
          t.any = next;
          if (t.any.complete()) {
            t.any = JsonCursor{};
            return value_done(std::move(t), out);
          }
          out.push_back(std::move(t));
          return;
        }
        // A number at the value's top level ends at the first byte that is not part of it.
        if (t.any.top_level_number_complete()) {
          t.any = JsonCursor{};
          t.frames.pop_back();
          finish_child(t);
          return step(std::move(t), b, out);
        }
        return;
      }
      default:
        return;
    }
  }

  static bool complete(const Thread& t) {
    if (t.frames.empty()) return true;
    if (t.frames.size() != 1) return false;
    const Frame& f = t.frames.back();
    if (f.kind == FNumber) return number_complete(f.state);
    if (f.kind == FAny) return t.any.top_level_number_complete();
    return false;
  }

 private:
  // Whether a value of `node` may begin with a whitespace byte: only a fixed text can. AnyOf and Sequence
  // edges are followed (compile() refuses cycles along them).
  bool starts_with_space(int32_t node) const {
    const SchemaNode& n = s_.nodes[static_cast<size_t>(node)];
    switch (n.kind) {
      case SchemaNode::Literals:
        for (const std::string& l : n.literals)
          if (!l.empty() && is_space(static_cast<uint8_t>(l[0]))) return true;
        return false;
      case SchemaNode::AnyOf:
        for (int32_t o : n.options)
          if (starts_with_space(o)) return true;
        return false;
      case SchemaNode::Sequence:
        return starts_with_space(n.options[0]);
      default:
        return false;
    }
  }

  const std::string& literal(const Frame& f) const {
    const SchemaNode& n = s_.nodes[static_cast<size_t>(f.node)];
    return f.kind == FKey ? n.keys[f.index] : n.literals[f.index];
  }

  // The parent of a finished value moves on (a sequence to its next value, or it is finished too).
  void finish_child(Thread& t) const {
    if (t.frames.empty()) return;
    Frame& p = t.frames.back();
    if (p.kind == FObject) {
      p.state = OAfter;
      ++p.index;
    } else if (p.kind == FArray) {
      p.state = AAfter;
    } else if (p.kind == FSeq) {
      const SchemaNode& n = s_.nodes[static_cast<size_t>(p.node)];
      if (++p.index < n.options.size()) {
        Frame v;
        v.kind = FValue;
        v.node = n.options[p.index];
        t.frames.push_back(v);
      } else {
        t.frames.pop_back();
        finish_child(t);
      }
    }
  }

  void value_done(Thread t, std::vector<Thread>& out) const {
    t.frames.pop_back();
    finish_child(t);
    out.push_back(std::move(t));
  }

  void value_start(Thread t, uint8_t b, std::vector<Thread>& out) const {
    Frame& f = t.frames.back();
    const SchemaNode& n = s_.nodes[static_cast<size_t>(f.node)];
    switch (n.kind) {
      case SchemaNode::Any:
      case SchemaNode::AnyObject:
        f.kind = FAny;
        t.any = n.kind == SchemaNode::Any ? JsonCursor::any_value() : JsonCursor{};  // the default: objects
        return step(std::move(t), b, out);
      case SchemaNode::Object:
        if (b != '{') return;
        f.kind = FObject;
        f.state = OOpen;
        f.index = 0;
        out.push_back(std::move(t));
        return;
      case SchemaNode::Array:
        if (b != '[') return;
        f.kind = FArray;
        f.state = AOpen;
        out.push_back(std::move(t));
        return;
      case SchemaNode::String:
        if (b != '"') return;
        f.kind = FString;
        f.state = 0;
        out.push_back(std::move(t));
        return;
      case SchemaNode::Number:
      case SchemaNode::Integer:
        f.kind = FNumber;
        f.integer = n.kind == SchemaNode::Integer;
        if (!start_number(f.state, b)) return;
        out.push_back(std::move(t));
        return;
      case SchemaNode::Literals:
        for (size_t i = 0; i < n.literals.size(); ++i) {
          Thread u = t;
          Frame& g = u.frames.back();
          g.kind = FLiteral;
          g.index = static_cast<uint16_t>(i);
          g.pos = 0;
          step(std::move(u), b, out);
        }
        return;
      case SchemaNode::AnyOf:
        for (int32_t o : n.options) {
          Thread u = t;
          u.frames.back().node = o;
          value_start(std::move(u), b, out);
        }
        return;
      case SchemaNode::Sequence: {
        f.kind = FSeq;
        f.index = 0;
        Frame v;
        v.kind = FValue;
        v.node = n.options[0];
        t.frames.push_back(v);
        return step(std::move(t), b, out);
      }
    }
  }

  void number(Thread t, uint8_t b, std::vector<Thread>& out) const {
    Frame& f = t.frames.back();
    switch (step_number(f.state, b, f.integer)) {
      case NumberStep::More:
        out.push_back(std::move(t));
        return;
      case NumberStep::Invalid:
        return;
      case NumberStep::Ended:  // the byte belongs to what follows the number
        t.frames.pop_back();
        if (t.frames.empty()) return;  // a top-level number has nothing after it
        finish_child(t);
        step(std::move(t), b, out);
        return;
    }
  }

  // The properties that may come next from index i: each optional one up to the first required one.
  void keys_from(const Thread& t, size_t i, std::vector<Thread>& out) const {
    const Frame& f = t.frames.back();
    const SchemaNode& n = s_.nodes[static_cast<size_t>(f.node)];
    for (size_t j = i; j < n.keys.size(); ++j) {
      Thread u = t;
      Frame& o = u.frames.back();
      o.state = OKey;
      o.index = static_cast<uint16_t>(j);
      Frame k;
      k.kind = FKey;
      k.node = f.node;
      k.index = static_cast<uint16_t>(j);
      k.pos = 1;  // the opening quote
      u.frames.push_back(k);
      out.push_back(std::move(u));
      if (n.required[j]) break;
    }
  }

  bool none_required_from(const Frame& f) const {
    const SchemaNode& n = s_.nodes[static_cast<size_t>(f.node)];
    for (size_t j = f.index; j < n.required.size(); ++j)
      if (n.required[j]) return false;
    return true;
  }

  void object(Thread t, uint8_t b, std::vector<Thread>& out) const {
    Frame& f = t.frames.back();
    const SchemaNode& n = s_.nodes[static_cast<size_t>(f.node)];
    switch (f.state) {
      case OOpen:
      case OAfter:
        if (b == '}') {
          if (!none_required_from(f)) return;
          return value_done(std::move(t), out);
        }
        if (f.state == OAfter) {
          if (b != ',' || f.index >= n.keys.size()) return;
          f.state = OComma;
          out.push_back(std::move(t));
          return;
        }
        [[fallthrough]];
      case OComma:
        if (b != '"') return;
        return keys_from(t, f.index, out);
      case OColon: {
        if (b != ':') return;
        f.state = OValue;
        Frame v;
        v.kind = FValue;
        v.node = n.values[f.index];
        t.frames.push_back(v);
        out.push_back(std::move(t));
        return;
      }
      default:
        return;
    }
  }

  void array(Thread t, uint8_t b, std::vector<Thread>& out) const {
    Frame& f = t.frames.back();
    const SchemaNode& n = s_.nodes[static_cast<size_t>(f.node)];
    if ((f.state == AOpen || f.state == AAfter) && b == ']') return value_done(std::move(t), out);
    if (f.state == AAfter) {
      if (b != ',') return;
      f.state = AComma;
      out.push_back(std::move(t));
      return;
    }
    if (f.state != AOpen && f.state != AComma) return;
    f.state = AValue;
    Frame v;
    v.kind = FValue;
    v.node = n.items;
    if (v.node < 0) {  // items unconstrained: any value
      v.kind = FAny;
      t.any = JsonCursor::any_value();
    }
    t.frames.push_back(v);
    step(std::move(t), b, out);
  }

  const CompiledSchema& s_;
};

// Steps every thread; duplicates merged in place, the set capped.
void step_all(const Automaton& a, const std::vector<Thread>& in, uint8_t b, std::vector<Thread>& out) {
  out.clear();
  for (const Thread& t : in) a.step(t, b, out);
  size_t kept = 0;
  for (size_t i = 0; i < out.size() && kept < kMaxThreads; ++i)
    if (std::find(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(kept), out[i]) ==
        out.begin() + static_cast<std::ptrdiff_t>(kept)) {
      if (i != kept) out[kept] = std::move(out[i]);
      ++kept;
    }
  out.resize(kept);
}

std::string state_key(const std::vector<Thread>& threads) {
  std::string k;
  for (const Thread& t : threads) {
    for (const Frame& f : t.frames) {
      const Frame g = f;
      k.append(reinterpret_cast<const char*>(&g.kind), 4);
      k.append(reinterpret_cast<const char*>(&g.index), 4);
      k.append(reinterpret_cast<const char*>(&g.node), 4);
    }
    const auto bits = t.any.key_bits();
    k.append(reinterpret_cast<const char*>(&bits.first), 8);
    k.append(reinterpret_cast<const char*>(&bits.second), 8);
    k.push_back(static_cast<char>(t.whitespace));
    k.push_back('|');
  }
  return k;
}

bool run(const CompiledSchema& s, const std::string& text, bool need_complete) {
  Automaton a(s);
  std::vector<Thread> threads = {a.start()}, next;
  for (unsigned char c : text) {
    step_all(a, threads, c, next);
    threads.swap(next);
    if (threads.empty()) return false;
  }
  if (!need_complete) return true;
  return std::any_of(threads.begin(), threads.end(), [](const Thread& t) { return Automaton::complete(t); });
}

class JsonSchemaConstraint final : public TokenConstraint {
 public:
  JsonSchemaConstraint(std::shared_ptr<const TokenTrie> trie, std::shared_ptr<const CompiledSchema> schema,
                       std::shared_ptr<MaskCache> cache)
      : trie_(std::move(trie)), schema_(std::move(schema)), cache_(std::move(cache)), automaton_(*schema_) {
    threads_ = {automaton_.start()};
  }

  std::unique_ptr<TokenConstraint> start(const std::vector<int32_t>& end_ids) const override {
    auto s = std::make_unique<JsonSchemaConstraint>(trie_, schema_, cache_);
    s->end_ids_ = end_ids;
    return s;
  }

  void mask(float* logits, int64_t vocab) override {
    // A value may be complete in one thread while others go on (a number, an enum's prefix of another).
    const bool may_end =
        threads_.empty() ||
        std::any_of(threads_.begin(), threads_.end(), [](const Thread& t) { return Automaton::complete(t); });
    const MaskCache::Mask allowed = allowed_now();
    apply_token_mask(logits, vocab, allowed->data(), trie_->vocab_size(), end_ids_, may_end, kept_);
  }

  void accept(int32_t token) override {
    if (std::find(end_ids_.begin(), end_ids_.end(), token) != end_ids_.end()) return;
    const std::string& bytes = trie_->bytes(token);
    if (bytes.empty()) threads_.clear();  // not a token the mask allowed: only the end is left
    for (unsigned char c : bytes) {
      step_all(automaton_, threads_, c, next_);
      threads_.swap(next_);
    }
  }

 private:
  // Bit t set: token t's bytes continue the text in some thread.
  MaskCache::Mask allowed_now() const {
    return cache_->get(state_key(threads_), [&] {
      return continuing_tokens(*trie_, threads_,
                               [this](const std::vector<Thread>& from, uint8_t b, std::vector<Thread>& to) {
                                 step_all(automaton_, from, b, to);
                                 return !to.empty();
                               });
    });
  }

  std::shared_ptr<const TokenTrie> trie_;
  std::shared_ptr<const CompiledSchema> schema_;
  std::shared_ptr<MaskCache> cache_;
  Automaton automaton_;
  std::vector<Thread> threads_, next_;
  std::vector<int32_t> end_ids_;
  std::vector<std::pair<int32_t, float>> kept_;
};

}  // namespace

bool schema_accepts(const CompiledSchema& schema, const std::string& text) { return run(schema, text, true); }
bool schema_accepts_prefix(const CompiledSchema& schema, const std::string& text) {
  return run(schema, text, false);
}

std::shared_ptr<const TokenConstraint> make_json_schema_constraint(
    std::shared_ptr<const TokenTrie> trie, std::shared_ptr<const CompiledSchema> schema) {
  INFERX_CHECK(trie != nullptr && schema != nullptr, "json schema constraint: no trie or schema");
  return std::make_shared<JsonSchemaConstraint>(std::move(trie), std::move(schema),
                                                std::make_shared<MaskCache>());
}

}  // namespace inferx
