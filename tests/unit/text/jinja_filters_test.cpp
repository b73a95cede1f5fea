// Jinja filters against Python jinja2 3.1.6 output (see jinja_test_util.h), including transformers'
// tojson (json.dumps with ensure_ascii=False, indent, separators, sort_keys).
#include <gtest/gtest.h>

#include "jinja_test_util.h"

namespace inferx {
namespace {

const jinja_test::Case kCases[] = {
    {"{{ '  x \\n' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ s | length }}|{{ u | length }}|{{ l | length "
     "}}|{{ d | count }}|{{ l | first }}|{{ l | last }}|{{ s | first }}",
     "x|hi|11|14|3|3|3|2|H"},
    {"{{ l | join(', ') }}|{{ l | join }}|{{ msgs | join('/', attribute='role') }}|{{ l | sort }}|{{ l | "
     "sort(reverse=true) }}|{{ ['b', 'A', 'c'] | sort }}|{{ ['b', 'A', 'c'] | sort(case_sensitive=true) "
     "}}|{{ msgs | sort(attribute='role') | map(attribute='role') | list }}",
     "3, 1, 2|312|system/user/assistant|[1, 2, 3]|[3, 2, 1]|['A', 'b', 'c']|['A', 'b', 'c']|['assistant', "
     "'system', 'user']"},
    {"{{ msgs | selectattr('role', 'equalto', 'user') | list }}|{{ msgs | rejectattr('role', 'eq', 'user') | "
     "map(attribute='role') | join(',') }}|{{ [0, 1, '', 'a', none] | select | list }}|{{ [1, 2, 3, 4] | "
     "reject('odd') | list }}|{{ l | select('gt', 1) | list }}|{{ msgs | selectattr('content') | list | "
     "length }}",
     "[{'role': 'user', 'content': 'hi'}]|system,assistant|[1, 'a']|[2, 4]|[3, 2]|3"},
    {"{{ l | map('string') | list }}|{{ ['a', 'B'] | map('upper') | list }}|{{ msgs | "
     "map(attribute='missing', default='z') | list }}|{{ l | sum }}|{{ l | max }}|{{ l | min }}|{{ [1, 1, "
     "'a', 'A', 2] | unique | list }}|{{ l | reverse | list }}|{{ s | reverse }}",
     "['3', '1', '2']|['A', 'B']|['z', 'z', 'z']|6|3|1|[1, 'a', 2]|[2, 1, 3]|dlroW olleH"},
    {"{{ d | dictsort }}|{{ {'b': 2, 'a': 3} | dictsort(by='value') }}|{{ d | items | list }}|{{ missing | "
     "items | list }}|{{ d | list }}|{{ s | list | length }}",
     "[('a', [1, 2]), ('b', 1), ('c', {'x': None})]|[('b', 2), ('a', 3)]|[('b', 1), ('a', [1, 2]), ('c', "
     "{'x': None})]|[]|['b', 'a', 'c']|11"},
    {"{{ missing | default('dv') }}|{{ none | default('dv') }}|{{ '' | default('dv', true) }}|{{ 0 | d(5) "
     "}}|{{ missing | string }}|{{ 12 | string }}|{{ l | string }}",
     "dv|None|dv|0||12|[3, 1, 2]"},
    {"{{ '42' | int }}|{{ 'x' | int }}|{{ 'x' | int(7) }}|{{ 3.9 | int }}|{{ ' 12 ' | int }}|{{ '3.7' | int "
     "}}|{{ '1.5' | float }}|{{ 3 | float }}|{{ 'q' | float }}|{{ -3 | abs }}|{{ -2.5 | abs }}",
     "42|0|7|3|12|3|1.5|3.0|0.0|3|2.5"},
    {"{{ 2.5 | round }}|{{ 3.5 | round }}|{{ 2.675 | round(2) }}|{{ 2.1 | round(0, 'ceil') }}|{{ 2.9 | "
     "round(method='floor') }}|{{ 7 | round }}|{{ 1.23456 | round(3) }}",
     "2.0|4.0|2.67|3.0|2.0|7|1.235"},
    {"{{ 'hello wORLD' | capitalize }}|{{ 'hello wORLD-foo (bar) [x]' | title }}|{{ s | upper }}|{{ s | "
     "lower }}|{{ s | replace('o', '0') }}|{{ 'aaa' | replace('a', 'b', 2) }}|{{ 'one two  three' | "
     "wordcount }}|{{ 'x' | center(5) }}|",
     "Hello world|Hello World-Foo (Bar) [X]|HELLO WORLD|hello world|Hell0 W0rld|bba|3|  x  |"},
    {"{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, first=true) }}|{{ 'a\\n\\nb' | indent('> ', "
     "blank=true) }}|{{ 'a\\nb\\n' | indent(3) }}",
     "a\n    b\n\n    c|  a\n  b|a\n> \n> b|a\n   b\n"},
    {"{{ d | tojson }}|{{ l | tojson(indent=2) }}|{{ {'k': '\xc3"
     "\xa9"
     "\"\\\\\\n\\u0001', 'n': none, 't': true, 'f': 1.0, 'e': [], 'o': {}} | tojson }}|{{ u | "
     "tojson(ensure_ascii=true) }}|{{ d | tojson(sort_keys=true) }}|{{ d | tojson(separators=(',', ':')) }}",
     "{\"b\": 1, \"a\": [1, 2], \"c\": {\"x\": null}}|[\n  3,\n  1,\n  2\n]|{\"k\": \"\xc3"
     "\xa9"
     "\\\"\\\\\\n\\u0001\", \"n\": null, \"t\": true, \"f\": 1.0, \"e\": [], \"o\": {}}|\"h\\u00e9llo "
     "w\\u00f6rld \\u65e5\\u672c\"|{\"a\": [1, 2], \"b\": 1, \"c\": {\"x\": "
     "null}}|{\"b\":1,\"a\":[1,2],\"c\":{\"x\":null}}"},
    {"{{ {'a': {'b': [1, {'c': 2}]}, 'x': []} | tojson(indent=4) }}|{{ [1e21, 1.5e-7, 0.1, -0.0, 100.0] | "
     "tojson }}|{{ '<&>' | e }}|{{ '%s-%s' | format('a', 1) }}",
     "{\n    \"a\": {\n        \"b\": [\n            1,\n            {\n                \"c\": 2\n           "
     " }\n        ]\n    },\n    \"x\": []\n}|[1e+21, 1.5e-07, 0.1, -0.0, 100.0]|&lt;&amp;&gt;|a-1"},
};

TEST(JinjaFilters, MatchPythonJinja2) {
  for (const auto& c : kCases) EXPECT_EQ(jinja_test::render(c.tmpl), c.expected) << c.tmpl;
}

}  // namespace
}  // namespace inferx
