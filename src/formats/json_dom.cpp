#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "formats/json_text.h"

namespace inferx {

namespace {

using json = nlohmann::ordered_json;

// nlohmann's SAX interface building an ordered_json DOM (json_text.h says why not nlohmann's own parser): a
// stack of open containers, each object with an index of its keys, and the slot the next value goes to (an
// array's new element or the value of the last key).
class DomBuilder {
 public:
  explicit DomBuilder(int max_depth) : max_depth_(max_depth) {}

  json take() { return std::move(root_); }

  bool null() { return put(json(nullptr)); }
  bool boolean(bool v) { return put(json(v)); }
  bool number_integer(json::number_integer_t v) { return put(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return put(json(v)); }
  bool number_float(json::number_float_t v, const json::string_t&) { return put(json(v)); }
  bool string(json::string_t& v) { return put(json(std::move(v))); }
  bool binary(json::binary_t& v) { return put(json(json::binary_t(std::move(v)))); }

  bool start_object(std::size_t) { return open(json::object()); }
  bool start_array(std::size_t) { return open(json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(json::string_t& k) {
    Open& o = stack_.back();
    auto& entries = static_cast<json::object_t::Container&>(o.value->get_ref<json::object_t&>());
    auto [it, added] = o.keys.try_emplace(k, entries.size());
    if (added) entries.emplace_back(std::move(k), nullptr);
    slot_ = &entries[it->second].second;
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    throw e;  // parse_error / out_of_range, as nlohmann's own parser throws them (sliced to json::exception)
  }

 private:
  struct Open {
    json* value;
    std::unordered_map<std::string, size_t> keys;  // objects: index of each key in the entries
  };

  // Where the next value goes: the root, an array's new element, or the slot of the object's last key.
  json* target() {
    if (stack_.empty()) return &root_;
    json* c = stack_.back().value;
    if (c->is_array()) {
      c->get_ref<json::array_t&>().emplace_back(nullptr);
      return &c->get_ref<json::array_t&>().back();
    }
    return slot_;
  }

  bool put(json v) {
    *target() = std::move(v);
    return true;
  }

  bool open(json empty) {
    if (static_cast<int>(stack_.size()) >= max_depth_) throw JsonTooDeep(max_depth_);
    json* t = target();
    *t = std::move(empty);
    // Safe to keep: a container's own elements only grow while it is the innermost open one.
    stack_.push_back(Open{t, {}});
    return true;
  }

  bool close() {
    stack_.pop_back();
    return true;
  }

  int max_depth_;
  json root_;
  std::vector<Open> stack_;
  json* slot_ = nullptr;
};

}  // namespace

json parse_ordered_json_dom(std::string_view text, int max_depth) {
  DomBuilder builder(max_depth);
  json::sax_parse(text.begin(), text.end(), &builder);
  return builder.take();
}

}  // namespace inferx
