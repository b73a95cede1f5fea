#pragma once
// Shared by the jinja_*_test.cpp files: render a template with the fixed variables the expected outputs
// were made with. The expected strings are Python jinja2 3.1.6's output, configured as transformers
// configures it (ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True), loopcontrols,
// transformers' tojson, strftime_now fixed at 2024-07-26), for the same template and variables.
#include <nlohmann/json.hpp>
#include <string>

#include "text/chat_template.h"

namespace inferx::jinja_test {

struct Case {
  const char* tmpl;
  const char* expected;
};

inline std::string render(const std::string& tmpl, const nlohmann::ordered_json& vars = nullptr) {
  ChatTemplateInputs in;
  in.extra =
      nlohmann::ordered_json::parse(R"({"s": "Hello World", "n": 7, "f": 2.5, "neg": -3, "l": [3, 1, 2],
    "d": {"b": 1, "a": [1, 2], "c": {"x": null}},
    "msgs": [{"role": "system", "content": " sys "}, {"role": "user", "content": "hi"},
             {"role": "assistant", "content": "yo"}],
    "u": "h\u00e9llo w\u00f6rld \u65e5\u672c", "e": "", "t": true, "none": null})");
  if (vars.is_object())
    for (auto it = vars.begin(); it != vars.end(); ++it) in.extra[it.key()] = it.value();
  in.now_unix = 1721952000;  // 2024-07-26 00:00:00 UTC
  return ChatTemplate(tmpl, "t").render(in);
}

}  // namespace inferx::jinja_test
