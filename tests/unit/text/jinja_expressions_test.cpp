// Jinja expressions: literals and escapes, operator precedence, Python arithmetic, comparisons, `in`,
// `~`, slicing, attribute/item lookup, tests, str/dict methods, printf-style %, printing values as
// Python str() does. Expected outputs: Python jinja2 3.1.6 (see jinja_test_util.h).
#include <gtest/gtest.h>

#include "jinja_test_util.h"

namespace inferx {
namespace {

const jinja_test::Case kCases[] = {
    {"{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 2 ** 3 ** 2 }}|{{ -2 ** 2 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 "
     "}}|{{ -7 % 3 }}|{{ 7 / 2 }}|{{ 6 / 2 }}",
     "7|9|64|4|3|-4|1|2|3.5|3.0"},
    {"{{ 1 < 2 < 3 }}|{{ 3 > 2 > 2 }}|{{ 1 == 1.0 }}|{{ true == 1 }}|{{ 'a' < 'b' }}|{{ [1, 2] == [1, 2] "
     "}}|{{ (1, 2) == [1, 2] }}",
     "True|False|True|True|True|True|False"},
    {"{{ 'ab' ~ 1 ~ none ~ true ~ 2.0 }}|{{ 'x' * 3 }}|{{ [1] * 2 }}|{{ [1] + [2] }}|{{ 'a' + 'b' }}",
     "ab1NoneTrue2.0|xxx|[1, 1]|[1, 2]|ab"},
    {"{{ not true or true and false }}|{{ none or 'dflt' }}|{{ 0 and 1 }}|{{ 'a' if n > 5 else 'b' }}|{{ 'x' "
     "if false }}|",
     "False|dflt|0|a||"},
    {"{{ 'ell' in s }}|{{ 2 in l }}|{{ 'b' in d }}|{{ 5 not in l }}|{{ 'z' not in d }}",
     "True|True|True|True|True"},
    {"{{ s[0] }}{{ s[-1] }}|{{ s[1:4] }}|{{ s[::-1] }}|{{ l[::2] }}|{{ l[-2:] }}|{{ l[:-1] }}|{{ u[1:4] "
     "}}|{{ s[100:] }}|{{ l[5:1:-1] }}",
     "Hd|ell|dlroW olleH|[3, 2]|[1, 2]|[3, 1]|\xc3"
     "\xa9"
     "ll||[2]"},
    {"{{ d.b }}|{{ d['a'][1] }}|{{ d.a.0 }}|{{ d.c.x }}|{{ d.missing }}", "1|2|1|None|"},
    {"{{ l }}|{{ d }}|{{ (1,) }}|{{ (1, 'a') }}|{{ none }}|{{ true }}|{{ [none, false, 'it\\'s', \"q\\\"\"] "
     "}}|{{ {'k': 1.5} }}",
     "[3, 1, 2]|{'b': 1, 'a': [1, 2], 'c': {'x': None}}|(1,)|(1, 'a')|None|True|[None, False, \"it's\", "
     "'q\"']|{'k': 1.5}"},
    {"{{ 1.0 }}|{{ 0.1 + 0.2 }}|{{ 1e16 }}|{{ 1e15 }}|{{ 0.0001 }}|{{ 0.00001 }}|{{ 1.5e-7 }}|{{ "
     "123456789.123 }}|{{ -0.0 }}|{{ 2 ** 62 }}",
     "1.0|0.30000000000000004|1e+16|1000000000000000.0|0.0001|1e-05|1.5e-07|123456789.123|-0.0|"
     "4611686018427387904"},
    {"{{ 'a\\tb\\n' }}|{{ \"\\x41\\u00e9\\U0001F600\" }}|{{ 'a' 'b' }}|{{ '\\d' }}|{{ 0x1F }}|{{ 1_000 }}|{{ "
     "0b101 }}|{{ 0o17 }}",
     "a\tb\n|A\xc3"
     "\xa9"
     "\xf0"
     "\x9f"
     "\x98"
     "\x80"
     "|ab|\\d|31|1000|5|15"},
    {"{{ s is string }}|{{ n is number }}|{{ t is number }}|{{ t is integer }}|{{ n is integer }}|{{ f is "
     "float }}|{{ l is sequence }}|{{ s is sequence }}|{{ d is mapping }}|{{ l is mapping }}|{{ d is "
     "iterable }}|{{ n is iterable }}|{{ missing is iterable }}",
     "True|True|True|False|True|True|True|True|True|False|True|False|True"},
    {"{{ missing is defined }}|{{ missing is undefined }}|{{ none is none }}|{{ t is true }}|{{ t is false "
     "}}|{{ t is boolean }}|{{ n is odd }}|{{ n is even }}|{{ 9 is divisibleby 3 }}|{{ 9 is divisibleby(2) "
     "}}|{{ 'a' is equalto 'a' }}|{{ 1 is eq 2 }}|{{ 2 is in l }}|{{ s is not none }}|{{ 'ab' is lower }}|{{ "
     "'AB' is upper }}",
     "False|True|True|True|False|True|True|False|True|False|True|False|True|True|True|True"},
    {"{{ s.upper() }}|{{ s.lower() }}|{{ s.startswith('He') }}|{{ s.endswith(('x', 'ld')) }}|{{ '  x  "
     "'.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '\\n a'.lstrip() }}|{{ 'a \\n'.rstrip() }}|{{ "
     "'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a-b-c'.rsplit('-', 1) }}",
     "HELLO WORLD|hello world|True|True|x|a|a|a|['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']|['a-b', 'c']"},
    {"{{ s.replace('l', 'L') }}|{{ s.replace('l', 'L', 1) }}|{{ s.title() }}|{{ 'hello world'.capitalize() "
     "}}|{{ s.find('o') }}|{{ s.count('l') }}|{{ '-'.join(['a', 'b']) }}|{{ 'abc'.split('</think>')[-1] "
     "}}|{{ u.upper() }}",
     "HeLLo WorLd|HeLlo World|Hello World|Hello world|4|3|a-b|abc|H\xc3"
     "\x89"
     "LLO W\xc3"
     "\x96"
     "RLD \xe6"
     "\x97"
     "\xa5"
     "\xe6"
     "\x9c"
     "\xac"
     ""},
    {"{{ d.get('b') }}|{{ d.get('zz') }}|{{ d.get('zz', 5) }}|{{ d.keys() | list }}|{{ d.values() | list | "
     "length }}|{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
     "1|None|5|['b', 'a', 'c']|3|b=1;a=[1, 2];c={'x': None};"},
    {"{{ 'x: %s, %d, %.2f, %5s|%-4d|%r' % ('a', 3, 2.345, 'b', 7, 'q') }}|{{ '%s' % 5 }}|{{ '100%%' % () }}",
     "x: a, 3, 2.35,     b|7   |'q'|5|100%"},
    // Python's own printf rules, not C's: negative hex / octal with a sign, '#o' as 0o, zero padding after
    // the sign even with a precision, widths and precisions of strings in characters, no 511-byte cut.
    {"{{ '%-6x|%6x|%06x|%#x|%#o|%+d|% d|%05.3d|%.0d|%x' % (-255, -255, -255, 255, 8, 5, 5, 7, 0, "
     "-9223372036854775807 - 1) }}",
     "-ff   |   -ff|-000ff|0xff|0o10|+5| 5|00007|0|-8000000000000000"},
    {"{{ '%-6s|%6s|%.2s|%8.3s|%3s' % ('\u00e9\u65e5', '\u00e9\u65e5', '\u00e9\u65e5\u672c', 'abcdef', "
     "'\u00e9') }}|{{ ('%600s' % 'a') | length }}|{{ ('%-600s|' % 'a')[590:] }}",
     "\u00e9\u65e5    |    \u00e9\u65e5|\u00e9\u65e5|     abc|  \u00e9|600|          |"},
    {"{{ '%e|%10.3f|%-10.2e|%+.1f|%g' % (12345.678, 3.14159, 0.000123, 2.25, 1e-5) }}|{{ '%d' % 3.99 }}|{{ "
     "'%i' % -2.5 }}",
     "1.234568e+04|     3.142|1.23e-04  |+2.2|1e-05|3|-2"},
    {"{{ range(3) | list }}|{{ range(1, 7, 2) | list }}|{{ range(5, 0, -2) | list }}|{{ dict(a=1, b='x') "
     "}}|{% set ns = namespace(a=1) %}{% set ns.a = ns.a + 1 %}{{ ns.a }}",
     "[0, 1, 2]|[1, 3, 5]|[5, 3, 1]|{'a': 1, 'b': 'x'}|2"},
};

TEST(JinjaExpressions, MatchPythonJinja2) {
  for (const auto& c : kCases) EXPECT_EQ(jinja_test::render(c.tmpl), c.expected) << c.tmpl;
}

}  // namespace
}  // namespace inferx
