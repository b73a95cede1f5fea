// Jinja errors and limits: syntax errors carry "NAME:LINE:COL", runtime errors and raise_exception()
// become inferx::Error with the template location, the sandbox's refusals (mutating methods, huge
// ranges) hold, and hostile templates (endless recursion, loops, output) stop with an error instead of
// hanging or exhausting memory.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "jinja_test_util.h"
#include "text/jinja/evaluator.h"
#include "text/jinja/parser.h"

namespace inferx {
namespace {

std::string error_of(const std::string& tmpl) {
  try {
    jinja_test::render(tmpl);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(JinjaErrors, SyntaxErrorsNameLineAndColumn) {
  EXPECT_EQ(error_of("line one\n  {% if %}x{% endif %}").rfind("t:2:", 0), 0u)
      << error_of("line one\n  {% if %}");
  EXPECT_NE(error_of("{% for x in l %}x").find("expected 'endfor'"), std::string::npos);
  EXPECT_NE(error_of("{% if true %}x").find("endif"), std::string::npos);
  EXPECT_EQ(error_of("ab\ncd {{ 1 + }}"), "t:2:11: unexpected end of print statement");
  EXPECT_NE(error_of("{% frobnicate %}").find("Encountered unknown tag 'frobnicate'"), std::string::npos);
  EXPECT_EQ(error_of("{{ x | nosuchfilter }}"), "t:1:8: No filter named 'nosuchfilter'.");
  EXPECT_NE(error_of("{{ x is nosuchtest }}").find("No test named 'nosuchtest'"), std::string::npos);
  EXPECT_NE(error_of("{{ 'abc }}").find("t:1:4:"), std::string::npos);
  EXPECT_NE(error_of("{# never closed").find("Missing end of comment tag"), std::string::npos);
  EXPECT_NE(error_of("{% raw %} never closed").find("Missing end of raw directive"), std::string::npos);
  EXPECT_NE(error_of("{{ (1 }}").find("t:1:"), std::string::npos);
  EXPECT_NE(error_of("{% break %}").find("outside of a loop"), std::string::npos);
  EXPECT_NE(error_of("{% include 'x' %}").find("not supported"), std::string::npos);
}

TEST(JinjaErrors, RuntimeErrorsCarryLocation) {
  EXPECT_EQ(error_of("ok\n{{ raise_exception('Roles must alternate') }}"), "t:2:4: Roles must alternate");
  EXPECT_EQ(error_of("{{ missing.attr }}"), "t:1:11: 'missing' is undefined");
  EXPECT_EQ(error_of("{{ d.nope.deeper }}"), "t:1:10: 'dict object' has no attribute 'nope'");
  EXPECT_NE(error_of("{{ 'a' + 1 }}").find("can only concatenate str"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 / 0 }}").find("division by zero"), std::string::npos);
  EXPECT_NE(error_of("{{ none | length }}").find("has no len()"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 < 'a' }}").find("not supported between"), std::string::npos);
  EXPECT_NE(error_of("{% for a, b in [1] %}{% endfor %}").find("unpack"), std::string::npos);
  EXPECT_NE(error_of("{% set x = 1 %}{% set x.y = 2 %}").find("non-namespace"), std::string::npos);
  // Python's printf: %x / %o want integers (%d truncates a float). A differential run of 20,000 random
  // conversions against Python 3 matched every output and error (2026-12-07).
  EXPECT_NE(error_of("{{ '%x' % 2.5 }}").find("an integer is required, not float"), std::string::npos);
  EXPECT_EQ(jinja_test::render("{{ '%d|%.1f' % (2.9, 2) }}"), "2|2.0");
  EXPECT_NE(error_of("{{ l | tojson }}{{ raise_exception }}{{ raise_exception | tojson }}")
                .find("not JSON serializable"),
            std::string::npos);
}

TEST(JinjaErrors, SandboxRefusesMutationAndHugeRanges) {
  EXPECT_NE(error_of("{{ l.append(4) }}").find("unsafe"), std::string::npos);
  EXPECT_NE(error_of("{{ d.update({'z': 1}) }}").find("unsafe"), std::string::npos);
  EXPECT_NE(error_of("{{ range(100001) | length }}").find("Range too big"), std::string::npos);
  EXPECT_EQ(jinja_test::render("{{ range(100000) | length }}"), "100000");
}

TEST(JinjaErrors, HostileTemplatesStop) {
  EXPECT_NE(error_of("{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}").find("recursion"),
            std::string::npos);
  EXPECT_NE(error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
                .find("evaluation steps"),
            std::string::npos);
  EXPECT_NE(
      error_of("{% set s = 'x' * 1000000 %}{% for i in range(100) %}{{ s }}{% endfor %}").find("exceeds"),
      std::string::npos);
  EXPECT_NE(error_of("{{ 'x' * 1000000000000 }}").find("too large"), std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}")
                .find("nested too deeply"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 99999999999999999999 }}").find("too large"), std::string::npos);
  EXPECT_NE(error_of("{{ 9223372036854775807 + 1 }}").find("overflow"), std::string::npos);
  // A string is iterated one Value (~100 bytes) per character: at most 2^20 characters (fuzz_jinja found
  // a 31M-character join that allocated 1 GB), counted before decoding for long byte strings.
  EXPECT_NE(error_of("{{ ('x' * 1048577) | join(',') | length }}").find("cannot iterate"), std::string::npos);
  EXPECT_NE(error_of("{{ ('x' * 30000000) | list | length }}").find("cannot iterate"), std::string::npos);
  EXPECT_NE(error_of("{% for c in 'é' * 1048577 %}{% endfor %}").find("cannot iterate"), std::string::npos);
  EXPECT_EQ(jinja_test::render("{{ ('x' * 1048576) | list | length }}"), "1048576");
}

// What fuzz_jinja found in longer runs (2026-12-07): strings copied on every lookup, joins, str() of lists
// and printf fields without a bound. Each must stop with an error (or finish) within seconds.
TEST(JinjaErrors, HugeStringsAreBoundedAndShared) {
  // A 20 MB string tested 100k times: lookups share it (a 60 MB one ran past a 50 s limit under ASan when
  // each copied it).
  EXPECT_EQ(jinja_test::render("{% set x = 'ab' * 10000000 %}{% for i in range(100000) %}{% if x %}{% endif "
                               "%}{% endfor %}{{ x | length }}|{{ x[-3:] }}|{{ ('abc' * 3) ~ ('' * 5) }}"),
            "20000000|bab|abcabcabc");
  EXPECT_NE(error_of("{{ ('ab' * 1000).join('x' * 1000000) | length }}").find("join(): result exceeds"),
            std::string::npos);
  EXPECT_NE(error_of("{{ ('x' * 1000000) | join('ab' * 1000) | length }}").find("join: result exceeds"),
            std::string::npos);
  EXPECT_NE(error_of("{% set l = ['a' * 1000000] * 1000 %}{{ l | join | length }}").find("result exceeds"),
            std::string::npos);
  EXPECT_NE(error_of("{% set l = ['a' * 1000000] * 1000 %}{{ l | string | length }}").find("str(): result"),
            std::string::npos);
  EXPECT_NE(error_of("{% set l = ['a' * 1000000] * 1000 %}{{ l | tojson | length }}").find("tojson: result"),
            std::string::npos);
  EXPECT_NE(error_of("{{ '%.999999999f' % 5.0 }}").find("precision too large"), std::string::npos);
  EXPECT_NE(error_of("{{ '%999999999d' % 5 }}").find("width or precision too large"), std::string::npos);
  EXPECT_EQ(jinja_test::render("{{ ('%1048576s%1048576s' % ('a', 'b')) | length }}"), "2097152");
}

std::string error_with(const jinja::Limits& limits, const std::string& tmpl) {
  const auto root = jinja::parse_template(tmpl, "t");
  jinja::RenderOptions options;
  options.limits = limits;
  jinja::Evaluator ev(*root, "t", options);
  try {
    ev.render({});
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A request's tool schema with 300k properties reaches the template as one dict: converted in linear time
// (DictData::set's search per key made it quadratic).
TEST(JinjaErrors, LargeJsonInputsConvertInLinearTime) {
  nlohmann::ordered_json big = nlohmann::ordered_json::object();
  auto& entries = static_cast<nlohmann::ordered_json::object_t::Container&>(
      big.get_ref<nlohmann::ordered_json::object_t&>());
  for (int i = 0; i < 300000; ++i) entries.emplace_back(fmt::format("p{}", i), i);
  EXPECT_EQ(jinja_test::render("{{ big | length }}|{{ big.p299999 }}|{{ (big | list)[7] }}", {{"big", big}}),
            "300000|299999|p7");
}

TEST(JinjaErrors, BytesOfStringsBuiltAreBounded) {
  jinja::Limits limits;
  limits.max_string_built = uint64_t{64} << 20;
  // Building a 10 MB string over and over: within the step limit, past the bytes a render may build (a 1 GiB
  // default; 64 MiB here). Copies do not count: the second template looks the string up 1000 times.
  const std::string build =
      "{% set x = 'a' * 10000000 %}{% for i in range(100) %}{% set y = x ~ 'b' %}{% endfor %}";
  EXPECT_NE(error_with(limits, build).find("built more than 67108864 bytes of strings"), std::string::npos);
  EXPECT_EQ(
      error_with(limits, "{% set x = 'a' * 10000000 %}{% for i in range(1000) %}{% set y = x %}{% endfor %}"),
      "(no error)");
}

TEST(JinjaErrors, RenderTimeIsBounded) {
  // Scanning a 30 MB string for a missing substring, 1000 times: seconds of work, a handful of steps each.
  jinja::Limits limits;
  limits.max_seconds = 0.05;
  EXPECT_NE(error_with(limits,
                       "{% set x = 'a' * 30000000 %}{% for i in range(1000) %}{% if 'b' in x %}{% endif "
                       "%}{% endfor %}")
                .find("exceeded 0.05 seconds"),
            std::string::npos);
}

TEST(JinjaErrors, DeeplyNestedValuesAreBounded) {
  jinja::Limits limits;
  limits.max_steps = 20'000'000;
  // A list nested 800k levels deep: its destruction (by the render's scope) recursed per level and
  // overflowed the stack. The render's arena now empties every container before the scope is destroyed.
  const std::string nest =
      "{% set ns = namespace(x=[], y=[]) %}{% for j in range(8) %}{% for i in range(100000) "
      "%}{% set ns.x = [ns.x] %}{% endfor %}{% endfor %}";
  EXPECT_EQ(error_with(limits, nest + "{{ ns.x | length }}"), "(no error)");
  EXPECT_NE(error_with(limits, nest + "{{ ns.x }}").find("nested too deeply to print"), std::string::npos);
  // == and < walk nested lists and dicts as Python does, up to 512 levels (a 400k-deep == crashed).
  const auto pair = [](int rounds, int levels) {  // rounds x levels deep (ranges stop at 100k)
    return "{% set ns = namespace(x=[], y=[]) %}{% for j in range(" + std::to_string(rounds) +
           ") %}{% for i in range(" + std::to_string(levels) +
           ") %}{% set ns.x = [ns.x] %}{% set ns.y = [{'k': ns.y}] %}{% endfor %}{% endfor %}";
  };
  EXPECT_EQ(jinja_test::render(pair(1, 200) + "{{ ns.x == ns.x }}{{ ns.x == ns.y }}{{ ns.x < ns.x + [1] }}"),
            "TrueFalseTrue");
  EXPECT_NE(error_with(limits, pair(4, 100000) + "{{ ns.y == ns.y }}").find("nested too deeply to compare"),
            std::string::npos);
  for (const std::string expr :
       {"ns.y == ns.y", "ns.y < ns.y + [1]", "ns.y in [ns.y]", "[ns.y, ns.y] | unique"}) {
    const std::string msg = error_with(limits, pair(1, 1000) + "{{ " + expr + " }}");
    EXPECT_NE(msg.find("nested too deeply to compare"), std::string::npos) << expr << ": " << msg;
  }
}

TEST(JinjaErrors, TransformersExtensions) {
  // transformers' AssistantTracker adds {% generation %}; rendering outputs its body unchanged.
  EXPECT_EQ(jinja_test::render("a{% generation %}b {{ n }}{% endgeneration %}c"), "ab 7c");
  // tools/documents are passed (as None) even when absent, so `is defined` holds and they are falsy.
  EXPECT_EQ(jinja_test::render("{{ tools is defined }}{{ tools is none }}{{ documents is none }}"),
            "TrueTrueTrue");
}

}  // namespace
}  // namespace inferx
