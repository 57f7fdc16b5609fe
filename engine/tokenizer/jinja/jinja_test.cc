// Unit tests of the chat-template interpreter's language: each feature's rendering
// (expected strings are what jinja2 3.1 renders under transformers' settings), its
// errors, and the limits that stop runaway templates.
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/civil_time.h"
#include "absl/time/time.h"
#include "engine/tokenizer/jinja/chat_template.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace specd {
namespace {

using ::testing::HasSubstr;

// Renders `source` with `context_json` (a JSON object, key order kept); errors come back
// as "ERROR: <message>" so that expectations read as one string.
std::string Render(absl::string_view source, absl::string_view context_json = "{}",
                   const ChatTemplateOptions& options = {}) {
  absl::StatusOr<ChatTemplate> tmpl = ChatTemplate::Parse(source);
  if (!tmpl.ok()) return absl::StrCat("ERROR: ", tmpl.status().ToString());
  absl::StatusOr<std::string> out =
      tmpl->RenderOrdered(nlohmann::ordered_json::parse(std::string(context_json)), options);
  if (!out.ok()) return absl::StrCat("ERROR: ", out.status().ToString());
  return *out;
}

// The status of parsing and rendering `source` with an empty context.
absl::Status RenderStatus(absl::string_view source, const ChatTemplateOptions& options = {}) {
  absl::StatusOr<ChatTemplate> tmpl = ChatTemplate::Parse(source);
  if (!tmpl.ok()) return tmpl.status();
  return tmpl->RenderOrdered(nlohmann::ordered_json::object(), options).status();
}

TEST(JinjaTest, RendersTextAndOutput) {
  EXPECT_EQ(Render(R"j(Hello {{ name }}!)j", R"j({"name": "world"})j"), "Hello world!");
  EXPECT_EQ(
      Render(
          R"j({{ 1 + 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 3 / 2 }} {{ 4 / 2 }})j"),
      "3 3 -4 2 1024 1.5 2.0");
  EXPECT_EQ(Render(R"j({{ 'a' ~ 1 ~ none ~ true }})j"), "a1NoneTrue");
  EXPECT_EQ(Render(R"j({{ [1, 'a', none, true, 1.5, {'k': "it's"}] }}{{ (1,) }})j"),
            "[1, 'a', None, True, 1.5, {'k': \"it's\"}](1,)");
  EXPECT_EQ(
      Render(
          R"j({{ 1e16 }} {{ 1e-5 }} {{ 0.1 + 0.2 }} {{ 1e15 }} {{ 0.0001 }} {{ -0.0 }} {{ 1.0e3 }})j"),
      "1e+16 1e-05 0.30000000000000004 1000000000000000.0 0.0001 -0.0 1000.0");
  EXPECT_EQ(Render(R"j({{ 'a\tb\x41\u00e9\d\'' }})j"), "a\tbAé\\d'");
  EXPECT_EQ(Render(R"j({{ 'a' 'b' }}{{ [1, 2,] }}{{ {'a': 1,} }}{{ () }}{{ (1) }}{{ (1, 2) }})j"),
            "ab[1, 2]{'a': 1}()1(1, 2)");
}

TEST(JinjaTest, WhitespaceControlMatchesTransformers) {
  EXPECT_EQ(Render("a\n  {# c #}\n  b\n{# d #}\nc"), "a\n  b\nc");
  EXPECT_EQ(Render("a\n  {%+ if true %}\nb{% endif +%}\nc"), "a\n  b\nc");
  EXPECT_EQ(Render("x\n"), "x");
  EXPECT_EQ(Render("x\n\n"), "x\n");
  EXPECT_EQ(Render(R"j(  {% if true %}x{% endif %}  )j"), "x  ");
  EXPECT_EQ(Render("{% if true %}\r\nx\r\n{% endif %}\r\n"), "x\n");
  EXPECT_EQ(Render("{#- c -#}  x  {#- c #}\ny"), "xy");
  EXPECT_EQ(Render(R"j(a  {{- ' b ' -}}  c)j"), "a b c");
  EXPECT_EQ(Render("  {{ 1 }}\n  {% if true %}A{% endif %}\n"), "  1\nA");
  EXPECT_EQ(Render("{% for m in ms %}\n  {{ m }}\n{% endfor %}", R"j({"ms": [1, 2]})j"),
            "  1\n  2\n");
  EXPECT_EQ(Render("{%- for m in ms -%}\n  [{{ m }}]\n{%- endfor %}", R"j({"ms": [1, 2]})j"),
            "[1][2]");
}

TEST(JinjaTest, RawBlocks) {
  EXPECT_EQ(Render("a\n  {% raw %}\n  {{ x }}\n  {% endraw %}\nb"), "a\n\n  {{ x }}\nb");
  EXPECT_EQ(Render(R"j(a {%- raw -%}  {% if %}  {%- endraw -%}  b)j"), "a{% if %}b");
}

TEST(JinjaTest, UndefinedPrintsEmptyAndTestsFalse) {
  EXPECT_EQ(
      Render(
          R"j([{{ foo }}]{{ foo is defined }}{{ foo is undefined }}{{ not foo }}{{ foo == none }})j"),
      "[]FalseTrueTrueFalse");
  EXPECT_EQ(
      Render(
          R"j({{ 'a' in foo }}{{ foo ~ 'x' }}{{ foo | length }}{{ foo | list }}{{ foo | join(',') }}|{{ foo | default('d') }}|{{ foo | trim }})j"),
      "Falsex0[]|d|");
  EXPECT_EQ(Render(R"j({% for x in foo %}a{% else %}empty{% endfor %})j"), "empty");
  EXPECT_EQ(
      Render(
          R"j({{ d.missing }}|{{ d['missing'] }}|{{ d.missing is defined }}|{{ none.x }}|{{ 'abc'.x }}|{{ [1][5] }}|{{ x.y.z }})j",
          R"j({"d": {"a": 1}, "x": {"y": {}}})j"),
      "||False||||");
  EXPECT_EQ(Render(R"j({{ 1 if false }}|{{ (1 if false) is defined }})j"), "|False");
  // An undefined key looks nothing up (no error), as Jinja's getitem.
  EXPECT_EQ(
      Render(R"j({% set m = {'a': 1} %}{{ m[nope] is defined }}|{{ [1][nope] }}|{{ m[m.zz] }})j"),
      "False||");
}

TEST(JinjaTest, Comparisons) {
  EXPECT_EQ(
      Render(
          R"j({{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 'a' < 'b' }}{{ [1, 2] < [1, 3] }}{{ 1 == 1.0 }}{{ true == 1 }}{{ 'a' != 'b' }}{{ 2 >= 2 }})j"),
      "TrueFalseTrueTrueTrueTrueTrueTrue");
  EXPECT_EQ(
      Render(
          R"j({{ 'a' in ['a'] }}{{ 'b' not in ['a'] }}{{ 'k' in {'k': 1} }}{{ 'ell' in 'hello' }}{{ none in [none] }})j"),
      "TrueTrueTrueTrueTrue");
  EXPECT_EQ(
      Render(
          R"j({{ not 1 == 2 }} {{ not x is defined }} {{ true and 'y' }} {{ 0 or 'z' }} {{ [] and 1 }})j"),
      "True True y z []");
}

TEST(JinjaTest, ConditionalsAndTernary) {
  EXPECT_EQ(
      Render(
          R"j({% for n in [1, 2, 3] %}{% if n == 1 %}one{% elif n == 2 %}two{% else %}many{% endif %},{% endfor %})j"),
      "one,two,many,");
  EXPECT_EQ(Render(R"j({{ 'x' if false else 'y' if true else 'z' }})j"), "y");
  EXPECT_EQ(Render(R"j({% if x %}T{% elif y %}Y{% else %}F{% endif %})j", R"j({"x": 0, "y": []})j"),
            "F");
}

TEST(JinjaTest, ForLoopVariables) {
  EXPECT_EQ(
      Render(
          R"j({% for x in items %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }};{% endfor %})j",
          R"j({"items": ["a", "b"]})j"),
      "10TrueFalse221;21FalseTrue210;");
  EXPECT_EQ(
      Render(
          R"j({% for a, b in [[1, 2], [3, 4]] %}{{ a }}{{ b }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %})j"),
      "12[3, 4];34[1, 2];");
  EXPECT_EQ(
      Render(
          R"j({% for x in [1, 2, 3, 4] if x > 1 %}{{ loop.index }}/{{ loop.length }}{{ loop.last }};{% endfor %})j"),
      "1/3False;2/3False;3/3True;");
  EXPECT_EQ(
      Render(
          R"j({% for k, v in d.items() if k != 'b' %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}{% for k, v in d | items %}{{ v }}{% endfor %})j",
          R"j({"d": {"a": 1, "b": 2, "c": 3}})j"),
      "a=1;c=3;abc123");
  EXPECT_EQ(Render(R"j({% for x in 'héllo' %}{{ x }},{% endfor %})j"), "h,é,l,l,o,");
  EXPECT_EQ(Render(R"j({% for x in [] %}x{% else %}empty{% endfor %})j"), "empty");
  EXPECT_EQ(Render(R"j({% for x in [1, 2, 3] %}{{ loop.cycle('a', 'b') }}{% endfor %})j"), "aba");
  EXPECT_EQ(
      Render(
          R"j({% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %})j"),
      "02");
  EXPECT_EQ(Render(R"j({% for m in messages[::-1] %}{{ m }}{% endfor %})j",
                   R"j({"messages": [1, 2, 3]})j"),
            "321");
}

TEST(JinjaTest, ScopingFollowsJinja) {
  EXPECT_EQ(
      Render(
          R"j({% for x in [1, 2, 3] %}{% if loop.first %}{% set a = 'A' %}{% endif %}[{{ a }}]{% endfor %})j"),
      "[A][][]");
  EXPECT_EQ(
      Render(
          R"j({% set a = 1 %}{% for x in [1, 2] %}{% set a = a + 1 %}{{ a }}{% endfor %}{{ a }})j"),
      "221");
  EXPECT_EQ(
      Render(
          R"j({% if true %}{% set y = 2 %}{% endif %}{{ y }}|{% for x in [1] %}{% set z = 2 %}{% endfor %}{{ z }})j"),
      "2|");
  EXPECT_EQ(Render(R"j({% set messages = messages[1:] %}{{ messages }})j",
                   R"j({"messages": [1, 2, 3]})j"),
            "[2, 3]");
  EXPECT_EQ(Render(R"j({% with a = 1 %}{{ a }}{% endwith %}[{{ a }}])j"), "1[]");
}

TEST(JinjaTest, SetNamespaceAndBlockSet) {
  EXPECT_EQ(
      Render(
          R"j({% set ns = namespace(total=0, seen=false) %}{% for x in [1, 2, 3] %}{% set ns.total = ns.total + x %}{% if x == 2 %}{% set ns.seen = true %}{% endif %}{% endfor %}{{ ns.total }} {{ ns.seen }})j"),
      "6 True");
  EXPECT_EQ(Render(R"j({% set ns = namespace() %}{% set ns.a = 'x' %}{{ ns.a }}{{ ns.b }})j"), "x");
  EXPECT_EQ(Render(R"j({% set a, b = 1, 2 %}{{ a }}{{ b }})j"), "12");
  EXPECT_EQ(
      Render(
          R"j({% set x %}a{{ 1 }}b{% endset %}{{ x }}|{% set y | upper %}lo{% endset %}{{ y }}|{% filter upper %}hi{% endfilter %})j"),
      "a1b|LO|HI");
}

TEST(JinjaTest, MacrosAndCallBlocks) {
  EXPECT_EQ(
      Render(
          R"j({% macro f(a, b='x') %}[{{ a }}{{ b }}{{ varargs }}{{ kwargs }}]{% endmacro %}{{ f(1) }}{{ f(1, 2, 3) }}{{ f(1, c=4) }}{{ f() }}{{ f(b=5, a=6) }})j"),
      "[1x(){}][12(3,){}][1x(){'c': 4}][x(){}][65(){}]");
  EXPECT_EQ(
      Render(
          R"j({% macro f(a) %}{{ outer }}{{ a }}{% endmacro %}{% set outer = 'O' %}{{ f(1) }}{% for i in [1] %}{% set outer = 'L' %}{{ f(2) }}{% endfor %})j"),
      "O1O2");
  EXPECT_EQ(
      Render(
          R"j({% macro f() %}<{{ caller('x') }}>{% endmacro %}{% call(v) f() %}got {{ v }}{% endcall %})j"),
      "<got x>");
  EXPECT_EQ(
      Render(
          R"j({% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1) | int }}{% endif %}{% endmacro %}{{ fact(5) }})j"),
      "120");
  EXPECT_EQ(Render(R"j({% for m in ms %}{% generation %}{{ m }}{% endgeneration %}{% endfor %})j",
                   R"j({"ms": [1, 2]})j"),
            "12");
}

TEST(JinjaTest, SubscriptsAndSlices) {
  EXPECT_EQ(
      Render(
          R"j({{ x.0 }}{{ x[-1] }}{{ x[1:] }}{{ x[:-1] }}{{ x[::2] }}{{ x[5:] }}{{ x[-2:] }}{{ x[::-1] }}{{ x[-1:0:-1] }})j",
          R"j({"x": [1, 2, 3]})j"),
      "13[2, 3][1, 2][1, 3][][2, 3][3, 2, 1][3, 2]");
  EXPECT_EQ(
      Render(R"j({{ s[1] }}{{ s[1:3] }}{{ s[::-1] }}{{ s | length }})j", R"j({"s": "héllo"})j"),
      "éélolléh5");
  EXPECT_EQ(
      Render(R"j({{ d['items'] }}|{{ d.a }}|{{ d['a'] }})j", R"j({"d": {"items": 1, "a": 2}})j"),
      "1|2|2");
}

TEST(JinjaTest, StringMethods) {
  EXPECT_EQ(
      Render(
          R"j({{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '\n\nx\n'.lstrip('\n') }}|{{ 'ayyx'.rstrip('xy') }}|{{ ' a '.strip(none) }})j"),
      "x|hi|x\n|a|a");
  EXPECT_EQ(
      Render(
          R"j({{ '  a b  '.split() }}{{ 'a,b,,c'.split(',') }}{{ 'a,b,c'.split(',', 1) }}{{ 'a b c'.rsplit(None, 1) }}{{ 'r</think>a'.split('</think>')[-1] }})j"),
      "['a', 'b']['a', 'b', '', 'c']['a', 'b,c']['a b', 'c']a");
  EXPECT_EQ(
      Render(
          R"j({{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('x') }}{{ 'ab'.startswith(('x', 'a')) }}{{ 'ab'.upper() }}{{ 'AbC'.lower() }}{{ 'hello wORLD-foo'.title() }}{{ 'hELLO'.capitalize() }})j"),
      "TrueFalseTrueABabcHello World-FooHello");
  EXPECT_EQ(
      Render(
          R"j({{ 'a b'.replace(' ', '_') }}{{ 'aaa'.replace('a', 'b', 2) }}{{ 'héllo'.find('l') }}{{ 'aaa'.count('a') }}{{ '-'.join(['a', 'b']) }}{{ 'a\nb\r\nc'.splitlines() }})j"),
      "a_bbba23a-b['a', 'b', 'c']");
  EXPECT_EQ(
      Render(
          R"j({{ '{} and {x}'.format(1, x=2) }}|{{ '{0}{0}{1!r}'.format('a', 'b') }}|{{ '{{}}'.format() }})j"),
      "1 and 2|aa'b'|{}");
}

TEST(JinjaTest, DictMethods) {
  EXPECT_EQ(
      Render(
          R"j({{ d.get('a') }}{{ d.get('q') }}{{ d.get('q', 'dflt') }}{{ d.get('q') is none }}{{ d.keys() | list }}{{ d.values() | list }}{{ d.items() | list }})j",
          R"j({"d": {"a": 1, "b": [2]}})j"),
      "1NonedfltTrue['a', 'b'][1, [2]][('a', 1), ('b', [2])]");
}

TEST(JinjaTest, Tests) {
  EXPECT_EQ(
      Render(
          R"j({{ 5 is divisibleby 5 }}{{ 4 is even }}{{ 3 is odd }}{{ 'abc' is lower }}{{ 'AB' is upper }}{{ x is mapping }}{{ none is none }}{{ 1 is eq 1 }}{{ 'a' is in 'abc' }})j",
          R"j({"x": {}})j"),
      "TrueTrueTrueTrueTrueTrueTrueTrueTrue");
  EXPECT_EQ(
      Render(
          R"j({{ 'x' is string }}{{ 1 is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ true is integer }}{{ 1 is number }}{{ true is number }}{{ [] is sequence }}{{ {} is sequence }}{{ 'a' is iterable }}{{ {} is iterable }}{{ 1 is iterable }})j"),
      "TrueTrueTrueTrueFalseTrueTrueTrueTrueTrueTrueFalse");
  EXPECT_EQ(
      Render(
          R"j({{ flag is true }}{{ flag is false }}{{ 1 is true }}{{ none is not none }}{{ x is not defined }}{{ range is callable }})j",
          R"j({"flag": false})j"),
      "FalseTrueFalseFalseTrueTrue");
  EXPECT_EQ(
      Render(
          R"j({{ 1 is sameas 1 }}{{ 'a' is equalto 'a' }}{{ 2 is gt 1 }}{{ 2 is lessthan 1 }}{{ 'upper' is filter }}{{ 'odd' is test }})j"),
      "TrueTrueTrueFalseTrueTrue");
}

TEST(JinjaTest, StringFilters) {
  EXPECT_EQ(
      Render(
          R"j({{ '  x  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ 'Ab' | upper }}{{ 'Ab' | lower }}|{{ 'Hello wORLD-foo(bar' | title }}|{{ 'hELLO' | capitalize }})j"),
      "x|hi|ABab|Hello World-Foo(Bar|Hello");
  EXPECT_EQ(
      Render(
          R"j({{ 'a b a' | replace('a', 'x') }}|{{ 'aaa' | replace('a', 'b', 1) }}|{{ 10 | string | length }}|{{ 'hello world foo' | wordcount }})j"),
      "x b x|baa|2|3");
  EXPECT_EQ(
      Render(
          R"j({{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}|{{ '\nx' | indent(2, true, true) }}|{{ 'a\nb' | indent('> ') }})j"),
      "a\n  b\n\n  c|  a\n  b|  \n  x|a\n> b");
  EXPECT_EQ(Render(R"j({{ '<a href="x">&\'</a>' | escape }}{{ 'x' | e }}{{ 1 | safe }})j"),
            "&lt;a href=&#34;x&#34;&gt;&amp;&#39;&lt;/a&gt;x1");
}

TEST(JinjaTest, NumberFilters) {
  EXPECT_EQ(
      Render(
          R"j({{ '5' | int + 1 }} {{ '3.5' | float }} {{ 'x' | int }} {{ '3.7' | int }} {{ 3.7 | int }} {{ 'x' | float }} {{ ' 7 ' | int }} {{ 'x' | int(9) }} {{ '0x1f' | int(base=16) }})j"),
      "6 3.5 0 3 3 0.0 7 9 31");
  EXPECT_EQ(
      Render(
          R"j({{ 2.5 | round }} {{ 3.5 | round }} {{ -2.5 | round }} {{ 2.567 | round(2) }} {{ 3 | round }} {{ 2.675 | round(2) }} {{ 2.1 | round(0, 'ceil') }} {{ 2.9 | round(method='floor') }} {{ 1234 | round(-2) }})j"),
      "2.0 4.0 -2.0 2.57 3 2.67 3.0 2.0 1200");
  EXPECT_EQ(Render(R"j({{ -1 | abs }} {{ -x | abs }} {{ -2.5 | abs }})j", R"j({"x": 3})j"),
            "1 3 2.5");
}

TEST(JinjaTest, SequenceFilters) {
  EXPECT_EQ(
      Render(
          R"j({{ [3, 1, 2] | sort }} {{ ['b', 'A', 'a'] | unique | list }} {{ {'b': 1, 'A': 2} | dictsort }} {{ ['b', 'A', 'c'] | sort(reverse=true) }})j"),
      "[1, 2, 3] ['b', 'A'] [('A', 2), ('b', 1)] ['c', 'b', 'A']");
  EXPECT_EQ(
      Render(
          R"j({{ [1, 2] | first }}{{ [1, 2] | last }}{{ 'ab' | last }}{{ [] | first }}|{{ [[1, 2], [3]] | sum(start=[]) }}{{ [1, 2] | sum }}{{ [3, 1] | min }}{{ [3, 1] | max }}{{ [1, 2] | reverse | list }}{{ 'ab' | reverse }})j"),
      "12b|[1, 2, 3]313[2, 1]ba");
  EXPECT_EQ(
      Render(
          R"j({{ x | map(attribute='a') | list }}{{ x | map(attribute='b', default='z') | list }}{{ ['a', 'b'] | map('upper') | join }}{{ ['1', '2'] | map('int') | sum }})j",
          R"j({"x": [{"a": 1}, {"a": 2}]})j"),
      "[1, 2]['z', 'z']AB3");
  EXPECT_EQ(
      Render(
          R"j({{ x | selectattr('a', 'equalto', 1) | list }}{{ x | rejectattr('a') | list }}{{ [1, 2, 3] | select('odd') | list }}{{ [1, none] | reject('none') | list }}{{ x | selectattr('a') | list | length }})j",
          R"j({"x": [{"a": 1}, {"a": 0}]})j"),
      "[{'a': 1}][{'a': 0}][1, 3][1]1");
  EXPECT_EQ(
      Render(
          R"j({{ ms | selectattr('role', 'equalto', 'user') | list | length }} {{ (ms | selectattr('role', 'equalto', 'user') | list)[-1].content }})j",
          R"j({"ms": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]})j"),
      "2 c");
  EXPECT_EQ(
      Render(
          R"j({{ [1, 2, 3] | join(', ') }}|{{ x | join(',', attribute='n') }}|{{ x | length }}{{ x | count }}{{ {'b': 1, 'a': 2} | list }}{{ {'b': 1} | first }})j",
          R"j({"x": [{"n": "a"}, {"n": "b"}]})j"),
      "1, 2, 3|a,b|22['b', 'a']b");
  EXPECT_EQ(
      Render(
          R"j({{ [{'n': 2}, {'n': 5}] | max(attribute='n') }}{{ [{'n': 'B'}, {'n': 'a'}] | sort(attribute='n') }}{{ {'b': 1, 'a': 2, 'c': 0} | dictsort(by='value', reverse=true) }})j"),
      "{'n': 5}[{'n': 'a'}, {'n': 'B'}][('a', 2), ('b', 1), ('c', 0)]");
}

TEST(JinjaTest, ToJsonMatchesPythonJsonDumps) {
  EXPECT_EQ(Render(R"j({{ x | tojson }})j",
                   R"j({"x": {"b": [1.0, 2.5e-07, null, true, "ü\u0001\"\\\n"], "a": {}}})j"),
            "{\"b\": [1.0, 2.5e-07, null, true, \"ü\\u0001\\\"\\\\\\n\"], \"a\": {}}");
  EXPECT_EQ(Render(R"j({{ x | tojson(indent=2) }})j",
                   R"j({"x": {"b": [1, {"c": "x"}], "a": {}, "e": []}})j"),
            "{\n  \"b\": [\n    1,\n    {\n      \"c\": \"x\"\n    }\n  ],\n  \"a\": {},\n  \"e\": "
            "[]\n}");
  EXPECT_EQ(Render(R"j({{ x | tojson(indent=0) }})j", R"j({"x": {"b": 1, "a": [1, 2]}})j"),
            "{\n\"b\": 1,\n\"a\": [\n1,\n2\n]\n}");
  EXPECT_EQ(Render(R"j({{ x | tojson(separators=(',', ':'), sort_keys=true) }})j",
                   R"j({"x": {"b": 1, "a": [1, 2]}})j"),
            "{\"a\":[1,2],\"b\":1}");
  EXPECT_EQ(Render(R"j({{ x | tojson(ensure_ascii=true) }})j", R"j({"x": "é😀"})j"),
            "\"\\u00e9\\ud83d\\ude00\"");
  EXPECT_EQ(Render(R"j({{ {'k': 1, 'a': none} | tojson }})j"), "{\"k\": 1, \"a\": null}");
}

TEST(JinjaTest, Globals) {
  EXPECT_EQ(
      Render(
          R"j({{ range(5) | list }}{{ range(2, 10, 3) | list }}{{ range(5, 0, -2) | list }}{{ range(0) | list }})j"),
      "[0, 1, 2, 3, 4][2, 5, 8][5, 3, 1][]");
  EXPECT_EQ(Render(R"j({{ dict(a=1, b='x') }}{{ namespace(a=1) }})j"),
            "{'a': 1, 'b': 'x'}<Namespace {'a': 1}>");
}

TEST(JinjaTest, SyntaxErrorsReportLineAndColumn) {
  absl::StatusOr<ChatTemplate> tmpl = ChatTemplate::Parse("Hello\n{% if x %}\n{{ 1 + }}");
  ASSERT_FALSE(tmpl.ok());
  EXPECT_EQ(tmpl.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tmpl.status().ToString(),
            "INVALID_ARGUMENT: chat template syntax error at line 3, column 8: unexpected '}}' in "
            "expression");

  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{% if x %}a",
       "line 1, column 12: unexpected end of template, expected 'elif' or "
       "'else' or 'endif'"},
      {"{% endfor %}", "line 1, column 4: unknown or unexpected tag 'endfor'"},
      {"{% frobnicate %}", "unknown or unexpected tag 'frobnicate'"},
      {"{{ 'abc }}", "line 1, column 4: unterminated string literal"},
      {"{{ x ", "line 1, column 1: missing '}}' before end of template"},
      {"{{ (1 + 2 }}", "line 1, column 11: unexpected '}', expected ')'"},
      {"{# never closed", "unterminated comment"},
      {"{% include 'x.j2' %}", "'include' is not supported in chat templates"},
      {"{% break %}", "'break' outside of a loop"},
      {"{% for x in y recursive %}{% endfor %}", "recursive loops are not supported"},
      {"{{ f(a=1, 2) }}", "positional argument follows keyword argument"},
      {"{{ 1 ! 2 }}", "unexpected character '!'"},
      {"{% set true = 1 %}", "cannot assign to 'true'"},
  };
  for (const auto& [source, message] : cases) {
    absl::Status status = RenderStatus(source);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << source;
    EXPECT_THAT(status.ToString(), HasSubstr(message)) << source;
  }
}

TEST(JinjaTest, RaiseExceptionPassesTheMessageThrough) {
  absl::Status status = RenderStatus("a{{ raise_exception('Roles must alternate!') }}b");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(status.message()), "Roles must alternate!");
}

TEST(JinjaTest, RuntimeErrorsAreInvalidArgumentWithLocation) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{{ foo.bar }}", "line 1, column 4: 'foo' is undefined"},
      {"\n  {{ foo['x'] }}", "line 2, column 6: 'foo' is undefined"},
      {"{{ foo + 1 }}", "'foo' is undefined"},
      {"{{ foo() }}", "'foo' is undefined"},
      {"{{ foo | int }}", "'foo' is undefined"},
      {"{{ foo | tojson }}", "Object of type Undefined is not JSON serializable"},
      {"{{ 'a' + 1 }}", "unsupported operand type(s) for +: 'str' and 'int'"},
      {"{{ 1 < 'a' }}", "comparison not supported between instances of 'int' and 'str'"},
      {"{{ 1 in 'abc' }}", "'in <string>' requires string as left operand, not int"},
      {"{{ 10 // 0 }}", "integer division or modulo by zero"},
      {"{{ 'abc'.nope() }}", "'str object' has no attribute 'nope'"},
      {"{{ 1 | nosuchfilter }}", "no filter named 'nosuchfilter'"},
      {"{{ 1 is nosuchtest }}", "no test named 'nosuchtest'"},
      {"{% for x in 5 %}{% endfor %}", "'int' object is not iterable"},
      {"{% for a, b in [1] %}{% endfor %}", "'int' object is not iterable"},
      {"{% for a, b in [[1, 2, 3]] %}{% endfor %}", "too many values to unpack"},
      {"{% set d = {'a': 1} %}{% set d.a = 2 %}", "cannot assign attribute on non-namespace"},
      {"{{ [1, 2].append(3) }}", "access to attribute 'append' of 'list' object is unsafe"},
      {"{{ {'a': 1}.update({}) }}", "access to attribute 'update' of 'dict' object is unsafe"},
      {"{{ 9223372036854775807 + 1 }}", "integer overflow"},
      {"{{ 'x'.split('') }}", "empty separator"},
      {"{{ {1: 'a'} }}", "dict keys must be strings"},
      {"{% macro m(a) %}{% endmacro %}{{ m(1, a=2) }}", "got multiple values for 'a'"},
      {"{{ 'abc'.startswith(1) }}", "expected a string"},
  };
  for (const auto& [source, message] : cases) {
    absl::Status status = RenderStatus(source);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << source;
    EXPECT_THAT(status.ToString(), HasSubstr(message)) << source;
  }
}

TEST(JinjaTest, RunawayRecursionStopsAtTheCallDepthLimit) {
  absl::Status status = RenderStatus("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.ToString(), HasSubstr("maximum macro call depth of 64"));
}

TEST(JinjaTest, HugeLoopOutputIsCapped) {
  const std::string source =
      "{% for i in range(100000) %}{% for j in range(100000) %}0123456789{% endfor %}"
      "{% endfor %}";
  absl::Status status = RenderStatus(source);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.ToString(), HasSubstr("output exceeds the limit of 8388608 bytes"));

  ChatTemplateOptions small;
  small.max_output_bytes = 1000;
  EXPECT_THAT(RenderStatus(source, small).ToString(), HasSubstr("limit of 1000 bytes"));
}

TEST(JinjaTest, LoopsWithoutOutputStopAtTheStepLimit) {
  const std::string source =
      "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
  ChatTemplateOptions options;
  options.max_steps = 100000;
  absl::Status status = RenderStatus(source, options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.ToString(), HasSubstr("work limit of 100000 steps"));
  // The default budget stops it too.
  EXPECT_THAT(RenderStatus(source).ToString(), HasSubstr("work limit"));
}

TEST(JinjaTest, GrowingStringsAndValuesAreCapped) {
  EXPECT_THAT(RenderStatus("{% set ns = namespace(s='x') %}{% for i in range(64) %}"
                           "{% set ns.s = ns.s ~ ns.s %}{% endfor %}")
                  .ToString(),
              HasSubstr("exceeds the limit"));
  EXPECT_THAT(RenderStatus("{{ 'x' * 1000000000 }}").ToString(), HasSubstr("exceeds the limit"));
  EXPECT_THAT(RenderStatus("{{ [1, 2] * 1000000000 }}").ToString(), HasSubstr("exceeds the limit"));
  EXPECT_THAT(RenderStatus("{{ 'aaaa' | replace('a', 'x' * 5000000) | length }}").ToString(),
              HasSubstr("exceeds the limit"));
  EXPECT_THAT(RenderStatus("{{ range(1000000000) | length }}").ToString(),
              HasSubstr("range too big"));
  EXPECT_THAT(RenderStatus("{% set ns = namespace(x=[]) %}{% for i in range(1000) %}"
                           "{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}")
                  .ToString(),
              HasSubstr("nested too deeply"));
  EXPECT_THAT(RenderStatus("{% set ns = namespace() %}{% set ns.me = ns %}").ToString(),
              HasSubstr("a namespace cannot be stored inside a namespace"));
}

TEST(JinjaTest, QuadraticCopiesAndSharedStructuresStayBounded) {
  // Each concatenation copies the list: charged per item, so this stops at the work limit.
  EXPECT_THAT(RenderStatus("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
                           "{% set ns.l = ns.l + [i] %}{% endfor %}{{ ns.l | length }}")
                  .ToString(),
              HasSubstr("work limit"));
  // Lists that share storage print (and serialize) to far more than they hold in memory.
  const std::string shared = "{% set a = range(100000) | list %}{% set b = [a] * 200000 %}";
  EXPECT_THAT(RenderStatus(shared + "{{ b }}").ToString(), HasSubstr("exceeds the limit"));
  EXPECT_THAT(RenderStatus(shared + "{{ b | tojson }}").ToString(), HasSubstr("exceeds the limit"));
  EXPECT_THAT(RenderStatus(shared + "{{ 'x' ~ b }}").ToString(), HasSubstr("exceeds the limit"));
  ChatTemplateOptions budget;  // a smaller work budget keeps this test fast
  budget.max_steps = 1'000'000;
  EXPECT_THAT(RenderStatus(shared + "{{ b | map('string') | list | length }}", budget).ToString(),
              HasSubstr("work limit"));
  EXPECT_THAT(RenderStatus(shared + "{{ b | unique | list | length }}", budget).ToString(),
              HasSubstr("work limit"));
  EXPECT_EQ(Render(shared + "{{ b == [a] * 200000 }}{{ (b | sort | length) }}"), "True200000");
}

TEST(JinjaTest, DeepNestingIsASyntaxErrorNotACrash) {
  const std::string parens = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_THAT(RenderStatus(parens).ToString(), HasSubstr("nested too deeply"));
  const std::string brackets = "{{ " + std::string(100000, '[') + " }}";
  EXPECT_EQ(RenderStatus(brackets).code(), absl::StatusCode::kInvalidArgument);
  std::string ifs;
  for (int i = 0; i < 2000; ++i) ifs += "{% if true %}";
  EXPECT_THAT(RenderStatus(ifs).ToString(), HasSubstr("nested too deeply"));
  std::string nots = "{{ ";
  for (int i = 0; i < 5000; ++i) nots += "not ";
  EXPECT_THAT(RenderStatus(nots + "1 }}").ToString(), HasSubstr("nested too deeply"));
}

TEST(JinjaTest, StrftimeNowFormatsTheConfiguredClock) {
  ChatTemplateOptions options;
  options.now = absl::FromCivil(absl::CivilSecond(2024, 7, 26, 13, 5, 0), absl::UTCTimeZone());
  options.time_zone = absl::UTCTimeZone();
  EXPECT_EQ(
      Render("{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M') }}", "{}", options),
      "26 Jul 2024|2024-07-26 13:05");
}

TEST(JinjaTest, RenderSortsKeysButRenderOrderedKeepsThem) {
  absl::StatusOr<ChatTemplate> tmpl = ChatTemplate::Parse("{{ tool | tojson }}");
  ASSERT_TRUE(tmpl.ok());
  const std::string json = R"({"tool": {"type": "function", "name": "f"}})";
  EXPECT_EQ(*tmpl->Render(nlohmann::json::parse(json)), R"({"name": "f", "type": "function"})");
  EXPECT_EQ(*tmpl->RenderOrdered(nlohmann::ordered_json::parse(json)),
            R"({"type": "function", "name": "f"})");
}

TEST(JinjaTest, ContextMustBeAnObject) {
  absl::StatusOr<ChatTemplate> tmpl = ChatTemplate::Parse("x");
  ASSERT_TRUE(tmpl.ok());
  EXPECT_EQ(tmpl->Render(nlohmann::json::array()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(JinjaTest, OneTemplateRendersOnManyThreadsAtOnce) {
  absl::StatusOr<ChatTemplate> tmpl = ChatTemplate::Parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
      "{{ m.content | upper }}{% endfor %}{{ ns.n }}");
  ASSERT_TRUE(tmpl.ok());
  std::vector<std::thread> threads;
  std::vector<int> failures(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        nlohmann::json context = {
            {"messages",
             {{{"content", absl::StrCat("t", t)}}, {{"content", absl::StrCat("i", i)}}}}};
        absl::StatusOr<std::string> out = tmpl->Render(context);
        if (!out.ok() || *out != absl::StrCat("T", t, "I", i, "2")) ++failures[t];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
}

// Cut-up and spliced real-template text must parse or fail cleanly, and whatever parses
// must render or fail cleanly: never crash or hang.
TEST(JinjaTest, MangledTemplatesFailCleanly) {
  const std::string source =
      "{%- set ns = namespace(i=0) %}{% for m in messages[::-1] if m.role != 'x' %}"
      "{{- '<|' ~ m.role ~ '|>\\n' + m.content | trim }}{% if loop.last %}{{ ns.i }}{% endif %}"
      "{% set ns.i = ns.i + 1 %}{% endfor %}{% macro f(a, b=[1, {'k': (2, 3)}]) %}{{ a.b[1:] }}"
      "{% endmacro %}{{ f(1) }}{# c #}{% raw %}{{x}}{% endraw %}";
  const nlohmann::json context = {
      {"messages", {{{"role", "user"}, {"content", " hi "}}, {{"role", "x"}, {"content", ""}}}}};
  uint64_t seed = 12345;
  auto next = [&seed] {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<size_t>(seed >> 33);
  };
  int parsed = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string mangled = source;
    const int edits = 1 + static_cast<int>(next() % 4);
    for (int e = 0; e < edits && !mangled.empty(); ++e) {
      const size_t at = next() % mangled.size();
      const size_t len = 1 + next() % 8;
      switch (next() % 3) {
        case 0:
          mangled.erase(at, len);
          break;
        case 1:
          mangled.insert(at, source.substr(next() % source.size(), len));
          break;
        default:
          mangled[at] = "{}%#()[]'\"|.-+~ \n"[next() % 17];
      }
    }
    absl::StatusOr<ChatTemplate> tmpl = ChatTemplate::Parse(mangled);
    if (!tmpl.ok()) {
      EXPECT_EQ(tmpl.status().code(), absl::StatusCode::kInvalidArgument) << mangled;
      continue;
    }
    ++parsed;
    absl::StatusOr<std::string> out = tmpl->Render(context);
    if (!out.ok()) {
      EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << mangled;
    }
  }
  EXPECT_GT(parsed, 100);
}

}  // namespace
}  // namespace specd
