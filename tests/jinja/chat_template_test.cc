// kvq's Jinja interpreter for chat templates (jinja/chat_template.h) on hand-written templates:
// every expected string here is what jinja2 3.1 (transformers' renderer,
// ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks) prints for the same template,
// checked by hand when the test was written. Also the errors (line:column of syntax errors and
// refused constructs, raise_exception's own message) and the limits that keep a hostile template
// from crashing or running away. The real templates of six models, against @huggingface/jinja, are
// in chat_template_oracle_test.cc.
#include "jinja/chat_template.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace kvq {
namespace {

using namespace std::string_literals;

const std::vector<ChatMessage> kConversation = {
    {"user", "u1"}, {"assistant", "a1"}, {"user", "u2"}};

std::string Repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

/// The rendered text, or "ERROR: <message>" (parse and render errors alike).
std::string Render(std::string_view source,
                   const std::vector<ChatMessage>& messages = kConversation,
                   const ChatRenderOptions& options = {}) {
  Result<ChatTemplate> t = ChatTemplate::Parse(source);
  if (!t.ok()) return "ERROR: " + t.status().message();
  Result<std::string> r = t->Render(messages, options);
  return r.ok() ? *r : "ERROR: " + r.status().message();
}

TEST(ChatTemplate, ChatMlFallback) {
  const ChatTemplate t = ChatTemplate::ChatMl();
  const std::vector<ChatMessage> messages = {{"system", "Be brief."}, {"user", "Hi"}};
  ChatRenderOptions options;
  Result<std::string> r = t.Render(messages, options);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  options.add_generation_prompt = false;
  EXPECT_EQ(*t.Render(messages, options),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_NE(t.source().find("<|im_start|>"), std::string::npos);
}

TEST(ChatTemplate, SourceIsKeptAsGiven) {
  const std::string source = "a\r\n{{ 'b' }}\n";
  Result<ChatTemplate> t = ChatTemplate::Parse(source);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->source(), source);
}

TEST(ChatTemplate, WhitespaceControl) {
  EXPECT_EQ(Render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(Render("a  {{- 'x' -}}  b {#- c -#}  d"), "axbd");
  EXPECT_EQ(Render("a \n {{- 'x' }} \n b"), "ax \n b");
}

TEST(ChatTemplate, TrimBlocksAndLstripBlocks) {
  // A tag alone on its line takes its indentation and its newline with it; {{ }} does not.
  EXPECT_EQ(Render("<ul>\n  {% for i in [1, 2] %}\n    <li>{{ i }}</li>\n  {% endfor %}\n</ul>\n"),
            "<ul>\n    <li>1</li>\n    <li>2</li>\n</ul>");
  EXPECT_EQ(Render("x\n  {# comment #}\ny"), "x\ny");
  EXPECT_EQ(Render("x {% if true %}\ny{% endif %}"), "x y");  // not at a line start: kept
  EXPECT_EQ(Render("  {%+ if true %}kept{% endif +%}\nnext"), "  kept\nnext");
  EXPECT_EQ(Render("  {{ 'expr' }}\n"), "  expr");  // one trailing newline of the template goes
}

TEST(ChatTemplate, NewlinesAreNormalised) {
  EXPECT_EQ(Render("line1\r\nline2\r\n{% if true %}\r\nz{% endif %}\r\n"), "line1\nline2\nz");
  EXPECT_EQ(Render("a\rb"), "a\nb");
}

TEST(ChatTemplate, ContentIsDataNotTemplate) {
  const std::vector<ChatMessage> messages = {
      {"user", "{{ x }} {% if true %}no{% endif %} {# c #}"}};
  EXPECT_EQ(Render("{% for m in messages %}[{{ m.content }}]{% endfor %}", messages),
            "[{{ x }} {% if true %}no{% endif %} {# c #}]");
}

TEST(ChatTemplate, Variables) {
  ChatRenderOptions options;
  options.bos_token = "<s>";
  options.eos_token = "</s>";
  EXPECT_EQ(Render("{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools }}|"
                   "{{ documents }}|{{ enable_thinking is defined }}|{{ messages | length }}",
                   kConversation, options),
            "<s>|</s>|True|None|None|False|3");
  options.enable_thinking = false;
  EXPECT_EQ(Render("{{ enable_thinking }}", {}, options), "False");
  options.now = std::chrono::sys_days(std::chrono::year(2026) / 3 / 7) + std::chrono::hours(14) +
                std::chrono::minutes(5);
  EXPECT_EQ(Render("{{ strftime_now('%d %b %Y, %A %B %H:%M %I%p %j %y-%m %%') }}", {}, options),
            "07 Mar 2026, Saturday March 14:05 02PM 066 26-03 %");
}

TEST(ChatTemplate, LiteralsAndOperators) {
  EXPECT_EQ(
      Render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} "
             "{{ 1.5 + 1 }} {{ 'ab' * 3 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 3.0 }} {{ -7.5 // 2 }} "
             "{{ 7.5 % -2 }} {{ 2 ** -1 }} {{ 1e-5 }} {{ 2 ** 3 ** 2 }}"),
      "3 -4 1 2 3.5 1024 2.5 ababab 0.30000000000000004 1e+20 3.0 -4.0 -0.5 0.5 1e-05 64");
  EXPECT_EQ(Render("{{ 1 < 2 < 3 }} {{ 1 < 2 > 3 }} {{ 'a' in 'cat' }} {{ 2 not in [1, 3] }} "
                   "{{ 'k' in {'k': 1} }} {{ 1 in [1.0] }} {{ [1, [2]] == [1, [2]] }}"),
            "True False True True True True True");
  EXPECT_EQ(Render("{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ [] or none }} {{ 'y' if 1 else 'n' }} "
                   "[{{ 'y' if 0 }}] {{ not 1 == 2 }} {{ -2 ** 2 }} {{ 1 + 2 * 3 - 4 / 2 }}"),
            "x b None y [] True 4 5.0");
  EXPECT_EQ(Render("{{ none }} {{ true }} {{ False }} {{ [1, 'a', none, true] }} {{ {'a': 'b'} }} "
                   "{{ 1 == 1.0 }} {{ true == 1 }} {{ '1' == 1 }} {{ [\"it's\", 'x\\ny'] }}"),
            "None True False [1, 'a', None, True] {'a': 'b'} True True False [\"it's\", 'x\\ny']");
  EXPECT_EQ(Render("{{ 'x' ~ 1 ~ none ~ nothing ~ [1] }}|{{ [1, 2] + [3] }}|{{ 'a' + 'b' }}"),
            "x1None[1]|[1, 2, 3]|ab");
  EXPECT_EQ(
      Render("{{ 'a' 'b' }}{{ \"it's\" }}{{ 'tab\\there' }}{{ '\\x41\\u00e9\\101' }}{{ 'a\\qb' }}"),
      "abit's"
      "tab\there"
      "A\u00e9A"
      "a\\qb");
}

TEST(ChatTemplate, StringMethods) {
  EXPECT_EQ(
      Render("{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '\\n\\n a'.lstrip('\\n') }}|"
             "{{ 'a \\n'.rstrip() }}|{{ ' a  b '.split() }}|{{ 'a,b,,c'.split(',') }}|"
             "{{ 'a b c'.split(' ', 1) }}|{{ '  a b c '.split(none, 1) }}|"
             "{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'ab'.replace('', '-') }}"),
      "a b|a| a|a|['a', 'b']|['a', 'b', '', 'c']|['a', 'b c']|['a', 'b c ']|bba|-a-b-");
  EXPECT_EQ(Render("{{ 'hello'.startswith('he') }} {{ 'hello'.endswith(('x', 'lo')) }} "
                   "{{ 'hello wORLD'.title() }} {{ 'hELLO'.capitalize() }} {{ 'Ab'.upper() }}"
                   "{{ 'Ab'.lower() }} {{ 'h\u00e9llo'.find('l') }} {{ '-'.join(['a', 'b']) }} "
                   "{{ 'abab'.count('ab') }}"),
            "True True Hello World Hello ABab 2 a-b 2");
}

TEST(ChatTemplate, Filters) {
  EXPECT_EQ(
      Render("{{ '  x  ' | trim }}|{{ 'abc' | length }}|{{ [1, 2] | count }}|"
             "{{ none | default('d') }}|{{ nothing | default('d') }}|{{ '' | d('d', true) }}|"
             "{{ [3, 4] | first }}{{ [3, 4] | last }}|{{ [1, 2] | join('-') }}|{{ 'ab' | list }}|"
             "{{ 5 | string }}|{{ '42' | int + 1 }}|{{ 'x' | int }}|{{ '2.5' | float }}|"
             "{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ [1, 2, 3] | reverse | list }}|{{ -3 | abs }}|"
             "{{ 'ab' | upper }}|{{ 'xyx' | trim('x') }}|{{ 'h\u00e9llo' | length }}|"
             "{{ 'abc' | reverse }}|{{ ['a', 'b'] | join }}|{{ 'x' | safe }}"),
      "x|3|2|None|d|d|34|1-2|['a', 'b']|5|43|0|2.5|a\n  b\n\n  c|[3, 2, 1]|3|AB|y|5|cba|ab|x");
  EXPECT_EQ(
      Render(
          "{{ {'b': [1, 2.5, none, true], 'a': '\u00e9\"\\n\\u0001'} | tojson }}|"
          "{{ [1, {'x': []}] | tojson(indent=2) }}|{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}|"
          "{{ '\u00e9\U0001F600' | tojson(ensure_ascii=true) }}|"
          "{{ {'a': 1} | tojson(separators=(',', ':')) }}"),
      "{\"b\": [1, 2.5, null, true], \"a\": \"\u00e9\\\"\\n\\u0001\"}|"
      "[\n  1,\n  {\n    \"x\": []\n  }\n]|{\"a\": 2, \"b\": "
      "1}|\"\\u00e9\\ud83d\\ude00\"|{\"a\":1}");
  EXPECT_EQ(
      Render(
          "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | "
          "join(',') }}|{{ messages | rejectattr('role', 'equalto', 'user') | list | length }}|"
          "{{ messages | selectattr('x') | list }}|{{ messages | map(attribute='x', default='-') "
          "| list }}|{{ ['a', 'B'] | map('upper') | list }}|"
          "{{ [1, 2, 3, 4] | select('odd') | list }}{{ [1, 2, 3, 4] | reject('odd') | list }}"),
      "u1,u2|1|[]|['-', '-', '-']|['A', 'B']|[1, 3][2, 4]");
  EXPECT_EQ(
      Render("{% set d = {'a': 1, 'b': 2} %}{% for k, v in d | items %}{{ k }}{{ v }}{% endfor %}"),
      "a1b2");
}

TEST(ChatTemplate, Tests) {
  EXPECT_EQ(
      Render("{{ messages is defined }}{{ y is undefined }}{{ none is none }}{{ 'a' is string }}"
             "{{ {} is mapping }}{{ [] is iterable }}{{ 'a' is sequence }}{{ 1.5 is number }}"
             "{{ 3 is integer }}{{ 3 is odd }}{{ 4 is even }}{{ 'a' is equalto 'a' }}"
             "{{ 6 is divisibleby 3 }}{{ 'abc' is lower }}{{ true is boolean }}{{ false is false }}"
             "{{ 2 is not string }}{{ 3 is gt 2 }}{{ 'a' is in 'cat' }}{{ y is iterable }}"
             "{{ namespace is callable }}"),
      Repeat("True", 21));
  EXPECT_EQ(Render("{{ none is not none }}{{ 1 is float }}{{ 'Ab' is lower }}{{ true is number }}"),
            "FalseFalseFalseTrue");
}

TEST(ChatTemplate, Loops) {
  EXPECT_EQ(
      Render(
          "{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}"
          "{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }};{% endfor %}"),
      "10TrueFalse332;21FalseFalse321;32FalseTrue310;");
  EXPECT_EQ(Render("{% for x in [] %}a{% else %}empty{% endfor %}|"
                   "{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}|"
                   "{% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %}|"
                   "{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}|"
                   "{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}|"
                   "{% for (a, b) in [[1, 2]] %}{{ a }}{{ b }}{% endfor %}|"
                   "{% for c in 'h\u00e9' %}[{{ c }}]{% endfor %}|"
                   "{% for u in nothing %}x{% else %}none{% endfor %}"),
            "empty|2242|ab|a=1;b=2;|37|12|[h][\u00e9]|none");
  EXPECT_EQ(Render("{% for i in [1, 2] %}{% for j in 'ab' %}{{ loop.index }}{{ j }}{% endfor %}"
                   "{{ loop.index }};{% endfor %}"),
            "1a2b1;1a2b2;");
  EXPECT_EQ(
      Render("{% for m in messages %}{{ loop.previtem is defined }}{{ loop.nextitem is defined }}"
             "{{ loop.previtem.role }};{% endfor %}"),
      "FalseTrue;TrueTrueuser;TrueFalseassistant;");
}

TEST(ChatTemplate, Scoping) {
  // A loop body's set lasts one iteration (jinja2; @huggingface/jinja keeps it across them);
  // a namespace carries values out; an if body is not a scope.
  EXPECT_EQ(
      Render("{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}|{{ x }}|"
             "{% set ns = namespace(total=0) %}{% for i in [1, 2, 3] %}"
             "{% set ns.total = ns.total + i %}{% endfor %}{{ ns.total }}|"
             "{% set a, b = 1, 2 %}{{ a }}{{ b }}|{% if true %}{% set inner = 5 %}{% endif %}{{ "
             "inner }}"),
      "23|1|6|12|5");
  EXPECT_EQ(
      Render("{% set greeting %}Hello {{ messages[0].content }}!{% endset %}[{{ greeting }}]"),
      "[Hello u1!]");
  EXPECT_EQ(Render("a{% generation %}b{{ 'c' }}{% endgeneration %}d"),
            "abcd");  // transformers' marker
}

TEST(ChatTemplate, SubscriptsAndSlices) {
  EXPECT_EQ(
      Render("{{ [1, 2, 3, 4][::-1] }}{{ [1, 2, 3, 4][1:] }}{{ [1, 2, 3, 4][:-1] }}"
             "{{ [1, 2, 3, 4][::2] }}{{ 'h\u00e9llo'[1:3] }}{{ 'h\u00e9llo'[::-1] }}{{ 'abc'[-1] }}"
             "{{ [1][5] }}{{ [1, 2, 3][-5:10] }}{{ [1, 2, 3][5:1:-1] }}{{ 'h\u00e9llo'[1] }}"
             "{{ messages[-1].content }}{{ messages[0]['role'] }}{{ [1, 2, 3][-2::-1] }}"),
      "[4, 3, 2, 1][2, 3, 4][1, 2, 3][1, 3]\u00e9loll\u00e9hc[1, 2, 3][3]\u00e9u2user[2, 1]");
  EXPECT_EQ(
      Render(
          "{% set d = {'a': 1, 'b': 2} %}{{ d.get('a') }}{{ d.get('z', 'dflt') }}{{ d.get('z') }}"
          "{{ d.keys() | list }}{{ d.values() | list }}{{ d['a'] }}{{ d.a }}{{ d.z }}"
          "{{ d | length }}{{ d | first }}{{ messages.0.role }}"),
      "1dfltNone['a', 'b'][1, 2]112auser");
}

TEST(ChatTemplate, RaiseExceptionIsTheError) {
  EXPECT_EQ(
      Render("{% if messages | length > 2 %}{{ raise_exception('Too many: ' ~ messages | length) }}"
             "{% endif %}"),
      "ERROR: Too many: 3");
}

TEST(ChatTemplate, SyntaxErrorsNameLineAndColumn) {
  EXPECT_EQ(Render("ok\n  {{ x + }}"),
            "ERROR: chat template 2:10: unexpected '}}' in an expression");
  EXPECT_EQ(
      Render("{% if true %}\nunclosed"),
      "ERROR: chat template 1:4: '{% if %}' is never closed: no '{% endif %}' before the end");
  EXPECT_EQ(Render("{{ 'unterminated }}"), "ERROR: chat template 1:4: unterminated string literal");
  EXPECT_EQ(Render("x\n\n   {{ 1 "),
            "ERROR: chat template 3:4: unterminated tag: no '}}' before the end of the template");
  EXPECT_EQ(Render("{% endif %}"), "ERROR: chat template 1:4: unknown or misplaced tag 'endif'");
  EXPECT_EQ(Render("{# open"), "ERROR: chat template 1:1: unterminated comment: no '#}'");
  EXPECT_EQ(Render("{{ a ? b }}"), "ERROR: chat template 1:6: unexpected character '?' in a tag");
  EXPECT_EQ(Render("\u00e9\u00e9{{ 1 ++ }}"),
            "ERROR: chat template 1:11: unexpected '}}' in an expression");
}

TEST(ChatTemplate, UnsupportedConstructsAreRefusedByName) {
  EXPECT_EQ(Render("{{ x }}\n{% macro m() %}x{% endmacro %}"),
            "ERROR: chat template 2:4: unsupported construct 'macro'");
  for (const char* tag : {"call", "filter", "include", "import", "from", "extends", "block", "with",
                          "do", "break", "continue", "raw"}) {
    EXPECT_EQ(Render("ab{% "s + tag + " x %}"),
              "ERROR: chat template 1:6: unsupported construct '"s + tag + "'");
  }
  EXPECT_EQ(Render("{{ x | wordwrap }}"),
            "ERROR: chat template 1:8: unsupported filter 'wordwrap'");
  EXPECT_EQ(Render("{{ x is escaped }}"), "ERROR: chat template 1:9: unsupported test 'escaped'");
  EXPECT_EQ(Render("{% for x in y recursive %}{% endfor %}"),
            "ERROR: chat template 1:15: unsupported construct 'recursive' loop");
  EXPECT_EQ(Render("{{ f(*args) }}"),
            "ERROR: chat template 1:6: unsupported construct: argument unpacking");
  EXPECT_EQ(
      Render("{{ '%s' % 1 }}"),
      "ERROR: chat template 1:9: unsupported construct: printf-style string formatting with '%'");
  EXPECT_EQ(Render("{{ 'a'.format(1) }}"),
            "ERROR: chat template 1:14: unsupported str method 'format'");
}

TEST(ChatTemplate, RenderErrors) {
  EXPECT_EQ(Render("{{ 'a' + 1 }}"),
            "ERROR: chat template 1:8: unsupported operand types for +: 'str' and 'int'");
  EXPECT_EQ(Render("{{ 1 // 0 }}"), "ERROR: chat template 1:6: integer division or modulo by zero");
  EXPECT_EQ(Render("{{ nothing() }}"), "ERROR: chat template 1:11: 'nothing' is undefined");
  EXPECT_EQ(Render("{% for a, b in [[1, 2, 3]] %}{% endfor %}"),
            "ERROR: chat template 1:4: cannot unpack 3 values into 2 names");
  EXPECT_EQ(Render("{{ 9223372036854775807 + 1 }}"),
            "ERROR: chat template 1:24: integer overflow in '+' (kvq's integers are 64-bit)");
  EXPECT_EQ(Render("{% set x = 1 %}{% set x.a = 2 %}"),
            "ERROR: chat template 1:19: cannot set attribute 'a' of 'x': only a namespace has "
            "assignable attributes");
}

// Where @huggingface/jinja (JavaScript) and jinja2 (Python) disagree, kvq prints jinja2's answer.
TEST(ChatTemplate, Jinja2WhereHuggingFaceJinjaDiffers) {
  EXPECT_EQ(Render("{{ '' != false }} {{ 0 == '' }} {{ [1] == [1] }}"), "True False True");
  EXPECT_EQ(Render("[{{ '\\n  x'.lstrip('\\n') }}]"), "[  x]");  // hf strips all whitespace
  EXPECT_EQ(Render("{{ messages | selectattr('tool_calls', 'undefined') | list | length }}"), "3");
  // Qwen 3's template keeps the leading space of an answer: content.lstrip('\n').
  EXPECT_EQ(Render("{{ (messages[1].content ~ ' x').lstrip('\\n') }}",
                   {{"user", "u"}, {"assistant", " lead"}}),
            " lead x");
}

/// Renders `source` and expects an error that contains `what`.
void ExpectError(const std::string& source, const std::string& what,
                 const ChatRenderOptions& options = {}) {
  const std::string r = Render(source, kConversation, options);
  EXPECT_EQ(r.rfind("ERROR: ", 0), 0u) << source.substr(0, 80);
  EXPECT_NE(r.find(what), std::string::npos) << source.substr(0, 80) << " -> " << r;
}

std::string Repeated(const std::string& s, int n) { return Repeat(s, n); }

TEST(ChatTemplate, NestingLimits) {
  ExpectError("{{ " + Repeated("(", 1000) + "1" + Repeated(")", 1000) + " }}",
              "nests deeper than 64");
  ExpectError("{{ " + Repeated("[", 100000) + Repeated("]", 100000) + " }}",
              "nests deeper than 64");
  ExpectError("{{ " + Repeated("[", 100000) + " }}", "nests deeper than 64");  // }} is in brackets
  ExpectError("{{ 1" + Repeated(" + 1", 1000) + " }}", "expression deeper than 128");
  ExpectError("{{ x" + Repeated(".a", 1000) + " }}", "expression deeper than 128");
  ExpectError("{{ x" + Repeated(" | trim", 1000) + " }}", "expression deeper than 128");
  ExpectError(Repeated("{% if true %}", 200), "nests deeper than 64");
  // A long elif chain is not nesting (read in a loop; evaluated in a loop).
  EXPECT_EQ(
      Render("{% if false %}" + Repeated("{% elif false %}", 20000) + "{% else %}else{% endif %}"),
      "else");
  ExpectError("{{ x" + Repeated("[0]", 1000) + " }}", "expression deeper than 128");
  ExpectError(Repeated("{% for x in y %}", 200), "nests deeper than 64");
  ExpectError("{{ " + Repeated("not ", 1000) + "x }}", "nests deeper than 64");
  ExpectError("{{ " + Repeated("-", 1000) + "1 }}", "nests deeper than 64");
  // Values nested without end, and a namespace that holds itself (printed, compared, as JSON).
  ExpectError(
      "{% set ns = namespace(v=[]) %}{% for i in range(200) %}{% set ns.v = [ns.v] %}{% endfor %}",
      "nest deeper than 100");
  ExpectError("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}", "nest deeper than 100");
  ExpectError("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns | tojson }}",
              "nest deeper than 100");
  EXPECT_EQ(Render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns == ns.me }}"), "True");
  // The source itself.
  Result<ChatTemplate> big =
      ChatTemplate::Parse(std::string(ChatTemplate::kMaxSourceBytes + 1, 'x'));
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("more than the 1048576 kvq reads"), std::string::npos);
}

TEST(ChatTemplate, WorkMemoryAndOutputLimits) {
  // The defaults, as chat_template.h states them; the tests below use smaller ones to stay fast.
  const ChatRenderLimits defaults;
  EXPECT_EQ(defaults.max_steps, 10'000'000);
  EXPECT_EQ(defaults.max_created_bytes, size_t{256} << 20);
  EXPECT_EQ(defaults.max_output_bytes, size_t{16} << 20);
  ExpectError("{% for i in range(1000000000) %}{% endfor %}", "bytes of values");
  ExpectError("{{ 'a' * 9223372036854775807 }}", "bytes of values");
  ExpectError("{{ range(-9223372036854775807, 9223372036854775807) | length }}", "bytes of values");

  ChatRenderOptions small;
  small.limits = {.max_steps = 100'000, .max_created_bytes = 1 << 20, .max_output_bytes = 64 << 10};
  ExpectError("{% set r = range(1000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}",
              "more than 100000 steps of work", small);
  ExpectError(
      "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
      "{% endfor %}",
      "more than 1048576 bytes of values", small);
  ExpectError("{{ ('a ' * 100000).split() | length }}", "bytes of values", small);
  ExpectError("{{ ('ab' * 100000).replace('a', 'xyz' * 10) | length }}", "bytes of values", small);
  ExpectError("{% for c in 'x' * 100000 %}{% endfor %}", "bytes of values", small);
  ExpectError("{% for i in range(10000) %}{{ 'x' * 100 }}{% endfor %}",
              "text longer than 65536 bytes", small);
  ExpectError("{% for i in range(10000) %}0123456789{% endfor %}", "text longer than 65536 bytes",
              small);
  ExpectError("{{ [('x' * 1000)] * 1000 }}", "text longer than 65536 bytes", small);
  ExpectError("{% set l = ['y' * 2000] * 1000 %}{% set j = l | tojson %}",
              "longer than 1048576 bytes", small);
  ExpectError(
      "{% set s = 'a' * 100000 %}{% for i in range(1000) %}{% if s == s ~ '' %}{% endif %}{% "
      "endfor %}",
      "bytes of values", small);
  ExpectError(
      "{% set s = 'a' * 60000 %}{% for i in range(1000) %}{% if 'b' in s %}{% endif %}{% endfor %}",
      "steps of work", small);
  // A conversation larger than the output limit.
  const std::vector<ChatMessage> big = {{"user", std::string(70 << 10, 'x')}};
  EXPECT_EQ(Render("{{ messages[0].content }}", big, small),
            "ERROR: chat template 1:1: text longer than 65536 bytes");
}

TEST(ChatTemplate, RendersFromSeveralThreadsAtOnce) {
  const ChatTemplate t = ChatTemplate::ChatMl();
  std::vector<std::string> outputs(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < outputs.size(); ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < 50; ++k) outputs[i] = *t.Render(kConversation, {});
    });
  }
  for (std::thread& th : threads) th.join();
  for (const std::string& out : outputs) EXPECT_EQ(out, outputs[0]);
}

}  // namespace
}  // namespace kvq
