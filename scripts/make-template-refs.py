#!/usr/bin/env python3
"""Generates tests/fixtures/text/template-refs.json: chat templates rendered by Hugging Face transformers.

Each case is a template (a file of tests/fixtures/text/templates/ or an inline snippet), an input (messages,
tools, add_generation_prompt, bos/eos tokens, extra variables) and either the text transformers renders or the
fact that transformers raises. The C test tests/text/test_template.c renders every case with tessera and
compares byte for byte (error cases must fail too).

Rendering goes through transformers' own render_jinja_template (the function behind
apply_chat_template(..., tokenize=False)), so whitespace handling, tojson, raise_exception and message
preprocessing are exactly Hugging Face's. Needs: pip install jinja2 transformers (no model download).

Usage: scripts/make-template-refs.py [--check]   (--check: compare with the stored file instead of writing)
"""
import json
import os
import sys

from transformers.utils.chat_template_utils import render_jinja_template

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TPL_DIR = os.path.join(ROOT, "tests", "fixtures", "text", "templates")
OUT = os.path.join(ROOT, "tests", "fixtures", "text", "template-refs.json")

# ---- conversations ----
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": ["string", "null"], "enum": ["celsius", "fahrenheit"], "description": "Unit "},
                "days": {"type": "integer", "description": "Forecast days"},
                "hours": {"type": "array", "items": {"type": "number"}, "description": "Hours"},
            },
            "required": ["city"],
        },
        "return": {"type": "object", "additionalProperties": {"type": "number"}},
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a time zone (émoji ok ⏰).",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string", "description": "IANA zone"}}},
    },
}
TOOLS = [WEATHER_TOOL, TIME_TOOL]

CONV = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system-multi": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "  And 3+3?  \n"},
    ],
    "alternating": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ],
    "unicode": [
        {"role": "system", "content": "Système: répondez en français. \"quotes\" and \\backslash\\"},
        {"role": "user", "content": "Bonjour 😀 — 你好\n\tline two"},
        {"role": "assistant", "content": "Salut ! <b>&amp;</b>"},
        {"role": "user", "content": "Ça va ?"},
    ],
    "tools": [
        {"role": "user", "content": "What's the weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}
            ],
        },
        {"role": "tool", "name": "get_weather", "content": "{\"temp\": 21.5, \"sky\": \"clear\"}"},
        {"role": "assistant", "content": "It is 21.5 °C and clear in Paris."},
        {"role": "user", "content": "Thanks"},
    ],
    "tools-multi": [
        {"role": "system", "content": "Use tools when needed."},
        {"role": "user", "content": "Weather in Oslo and the time there?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
                {"type": "function", "function": {"name": "get_time", "arguments": "{\"tz\": \"Europe/Oslo\"}"}},
            ],
        },
        {"role": "tool", "content": "<tool_response>-3</tool_response>"},
        {"role": "tool", "content": "12:00"},
    ],
    "reasoning": [
        {"role": "user", "content": "Is 17 prime?"},
        {"role": "assistant", "content": "<think>\nCheck divisors up to 4.\n</think>\n\nYes, 17 is prime."},
        {"role": "user", "content": "And 21?"},
        {"role": "assistant", "content": "No: 3 × 7.", "reasoning_content": "21 = 3 * 7"},
    ],
    "deepseek-tools": [
        {"role": "system", "content": "SYS"},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}},
                {"type": "function", "function": {"name": "get_time", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "noon"},
        {"role": "assistant", "content": "<think>ok</think>Sunny at noon."},
    ],
    "multimodal": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in this image?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
        {"role": "user", "content": [{"type": "text", "text": "And here?"}, {"type": "image", "image": "x.png"}]},
    ],
    "bad-alternation": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    "system-first": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
}

# template file -> (conversations, bos, eos, with tools?, extra variable sets)
TEMPLATES = {
    "chatml": (["user", "system-multi", "unicode", "alternating"], None, None, False, [None]),
    "mistral-inst": (["user", "alternating", "unicode", "bad-alternation", "system-first"], "<s>", "</s>", False,
                     [None]),
    "llama2-chat": (["user", "system-multi", "alternating", "bad-alternation"], "<s>", "</s>", False, [None]),
    "gemma": (["user", "alternating", "system-first", "bad-alternation"], "<bos>", "<eos>", False, [None]),
    "phi3": (["user", "system-multi", "unicode"], "<s>", "<|endoftext|>", False, [None]),
    "deepseek-r1": (["user", "system-multi", "deepseek-tools", "reasoning"], "<｜begin▁of▁sentence｜>",
                    "<｜end▁of▁sentence｜>", False, [None]),
    "llama3": (["user", "system-multi", "unicode"], "<|begin_of_text|>", "<|end_of_text|>", False, [None]),
    "llama3.1-tools": (["user", "system-multi", "tools", "unicode"], "<|begin_of_text|>", "<|eot_id|>", True,
                       [None, {"tools_in_user_message": False, "date_string": "01 Jan 2025"},
                        {"builtin_tools": ["brave_search", "code_interpreter", "get_weather"]}]),
    "qwen3": (["user", "system-multi", "tools", "tools-multi", "reasoning", "unicode"], None, "<|im_end|>", True,
              [None, {"enable_thinking": False}]),
    "qwen2-vl": (["multimodal", "system-multi", "user"], None, None, False, [None, {"add_vision_id": True}]),
    "generation": (["system-multi", "unicode"], None, "</s>", False, [None]),
    "hermes-macros": (["user", "tools"], "<s>", None, True, [None]),
}

# ---- micro cases: (name, template, variables) exercising one feature each ----
M = [{"role": "user", "content": "hi"}]
MICRO = [
    ("ws-default", "a  \n  {% if true %}\n  x\n  {% endif %}\n  b\n", {}),
    ("ws-minus", "a  \n  {%- if true -%}\n  x  \n  {%- endif %}  b", {}),
    ("ws-plus", "a\n  {%+ if true +%}\nx\n{% endif %}\n", {}),
    ("ws-var", "a\n  {{ 'x' }}\n  {{- 'y' -}}  \n z", {}),
    ("ws-comment", "a\n  {# c #}\nb {#- c -#} c\n{# multi\nline #}\nd", {}),
    ("ws-crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc\r\n", {}),
    ("ws-trailing-newline", "x\n", {}),
    ("ws-raw", "{% raw %}{{ not evaluated }}{% endraw %}|{%- raw -%}  a  {%- endraw %}|", {}),
    ("literals",
     "{{ 1 }} {{ -2 }} {{ 3.50 }} {{ 1e3 }} {{ 'a\\tb\\u00e9\\x41\\\\' }} {{ \"q'\" }} {{ true }} {{ None }} "
     "{{ [1, 'a', none, 2.0] }} {{ {'k': [1], 'b': false} }} {{ (1,) }} {{ (1, 2) }} {{ 'ab' 'cd' }}", {}),
    ("arith",
     "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} "
     "{{ 1.5 + 1 }} {{ 'a' ~ 1 ~ none }} {{ 'ab' * 3 }} {{ [1] * 2 }} {{ [1] + [2] }} {{ 10 / 4 }} {{ 0.1 + 0.2 }} "
     "{{ 1e16 }} {{ 1e-5 }} {{ 123456789.0 * 10 }}", {}),
    ("compare",
     "{{ 1 < 2 < 3 }} {{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 'a' in 'cat' }} {{ 2 not in [1] }} "
     "{{ 'k' in {'k': 1} }} {{ true == 1 }} {{ none == none }} {{ 'x' != 'y' }}", {}),
    ("logic",
     "{{ 1 and 'x' }} {{ 0 or 'y' }} {{ not 0 }} {{ none or [] }} {{ 'a' if false else 'b' }} "
     "[{{ 'a' if false }}] {{ not 1 == 2 }}", {}),
    ("index-slice",
     "{% set s = 'héllo wörld' %}{{ s[1] }} {{ s[-1] }} {{ s[::-1] }} {{ s[1:4] }} {{ s[:-3] }} {{ s[::2] }} "
     "{{ [1,2,3,4][1:] }} {{ [1,2,3,4][::-1] }} {{ [1,2,3,4][-2:] }} {{ [1,2,3][5:] }} "
     "[{{ [1][3] }}] {{ messages[0].role }} {{ messages[0]['content'] }} {{ messages.0.role }} {{ [1,2,3][0:3:2] }}",
     {"messages": M}),
    ("loop-vars",
     "{% for x in ['a','b','c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
     "{{ loop.first }}{{ loop.last }}{{ loop.length }}[{{ loop.previtem }}"
     "|{{ loop.nextitem }}]{{ loop.cycle('o','e') }} {% endfor %}", {}),
    ("loop-else-filter",
     "{% for x in [] %}x{% else %}empty{% endfor %} "
     "{% for x in range(10) if x is odd %}{{ x }}{% if loop.last %}!{% endif %}{% endfor %} "
     "{% for x in undefined_thing %}x{% else %}u{% endfor %}", {}),
    ("loop-break-continue",
     "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 5 %}{% break %}{% endif %}{{ i }}"
     "{% endfor %}|{% for i in range(3) %}{% for j in range(3) %}{% if j == 1 %}{% break %}{% endif %}{{ i }}{{ j }} "
     "{% endfor %}{% endfor %}", {}),
    ("loop-dict",
     "{% for k, v in {'b': 1, 'a': 2}.items() %}{{ k }}={{ v }};{% endfor %}{% for k in {'x': 1, 'y': 2} %}{{ k }}"
     "{% endfor %}{% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %}{% for c in 'héj' %}[{{ c }}]{% endfor %}",
     {}),
    ("scoping",
     "{% set c = 0 %}{% for i in [1,2,3] %}{% set c = c + i %}{{ c }}{% endfor %}{{ c }}|{% for i in [1,2] %}"
     "{% if loop.first %}{% set y = 5 %}{% endif %}{{ y }},{% endfor %}|{% if true %}{% set z = 3 %}{% endif %}{{ z }}",
     {}),
    ("namespace",
     "{% set ns = namespace(n=0, items=[]) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }} "
     "{% set ns.last = 'x' %}{{ ns.last }}", {}),
    ("set-tuple-block",
     "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set x %}hi {{ a }}\n{% endset %}[{{ x }}]{% set (p, q) = ['p', 'q'] %}"
     "{{ p }}{{ q }}", {}),
    ("macro",
     "{% macro f(a, b=2, c='z') %}[{{ a }}{{ b }}{{ c }}]{% endmacro %}{{ f(1) }}{{ f(1, 3) }}{{ f(1, c='y') }}"
     "{{ f() }}{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(3) }}", {}),
    ("with-filterblock",
     "{% with a = 1, b = 'x' %}{{ a }}{{ b }}{% endwith %}{{ a is defined }}{% filter upper %}shout {{ 'it' }}"
     "{% endfilter %}", {}),
    ("generation-tag",
     "{% for m in messages %}{% generation %}<{{ m.content }}>{% endgeneration %}{% endfor %}", {"messages": M}),
    ("filters-str",
     "{{ '  a b  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ 'hello world' | upper }}|{{ 'HeLLo' | lower }}"
     "|{{ 'hello WORLD' | capitalize }}|{{ 'hello big-world (x)' | title }}|{{ 'aaa' | replace('a', 'b', 2) }}"
     "|{{ 'abc' | replace('', '-') }}|{{ 'ÉCOLE' | lower }}|{{ 'straße' | upper }}|{{ '<a href=\"x\">&</a>' | e }}"
     "|{{ 'x' | safe }}|{{ 'one two  three' | wordcount }}|{{ 'abc' | reverse }}", {}),
    ("filters-seq",
     "{{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c'] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} {{ [1, 2, 3] | first }} "
     "{{ [1, 2, 3] | last }} {{ [1, 2] | length }} {{ 'héllo' | length }} {{ {'a': 1} | count }} "
     "{{ [1, 2, 3] | join('-') }} {{ [1, 2, 3] | sum }} {{ [1, 5, 3] | max }} {{ [4, 2, 8] | min }} {{ 'ab' | list }} "
     "{{ ['a', 'A', 'b', 'a'] | unique | list }} {{ [1, 2] | reverse | list }} {{ {'b': 1, 'a': 2} | dictsort }} "
     "{{ {'b': 1, 'a': 2} | items | list }} {{ [1, 2, 3] | select('odd') | list }} "
     "{{ [1, 2, 3] | reject('odd') | list }} {{ ['a', 'b'] | map('upper') | join }}", {}),
    ("filters-attr",
     "{{ messages | map(attribute='role') | join(',') }} "
     "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }} "
     "{{ messages | rejectattr('role', 'eq', 'user') | list | length }} "
     "{{ messages | selectattr('tool_calls', 'defined') | list | length }} "
     "{{ messages | selectattr('content') | list | length }} "
     "{{ messages | map(attribute='missing', default='d') | list }} "
     "{{ messages | sort(attribute='content') | map(attribute='content') | join }} "
     "{{ messages | join(',', attribute='role') }}",
     {"messages": [{"role": "user", "content": "b"}, {"role": "assistant", "content": "a", "tool_calls": []}]}),
    ("filters-num",
     "{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '2.5' | float }} "
     "{{ 'y' | float }} {{ -3 | abs }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 3.14159 | round(2) }} "
     "{{ 2.7 | round(method='floor') }} {{ 5 | string ~ 'x' }} {{ true | int }}", {}),
    ("filters-default",
     "{{ undefined_var | default('d') }} {{ '' | default('e') }} {{ '' | default('e', true) }} {{ none | d('n') }} "
     "{{ false | default('f', boolean=true) }} {{ undefined_var | length }} "
     "[{{ undefined_var }}] {{ undefined_var is defined }} {{ undefined_var is undefined }}", {}),
    ("filters-tojson",
     "{{ messages | tojson }}|{{ {'a': [1, 2.5, none, true, 'é\"\\n'], 'b': {}} "
     "| tojson }}|{{ {'z': 1, 'a': {'y': [], 'b': 2}} "
     "| tojson(indent=2) }}|{{ {'z': 1, 'a': 2} | tojson(sort_keys=true) }}|{{ 'ünï' | tojson(ensure_ascii=true) }}"
     "|{{ [1, 2] | tojson(separators=(',', ':')) }}|{{ {'k': 1} | tojson(indent='\\t') }}|{{ 1e20 | tojson }}"
     "|{{ 3.0 | tojson }}", {"messages": M}),
    ("filters-indent",
     "{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(width='> ', blank=true) }}"
     "|{{ 'x\\n' | indent(3) }}", {}),
    ("tests",
     "{{ 1 is number }}{{ 1.0 is float }}{{ 1 is integer }}{{ true is boolean }}{{ true is integer }}"
     "{{ 'a' is string }}{{ {} is mapping }}{{ [] is iterable }}{{ 'a' is sequence }}{{ none is none }}"
     "{{ true is true }}{{ 0 is false }}{{ 3 is odd }}{{ 4 is even }}{{ 6 is divisibleby 3 }}{{ 'a' is in 'cat' }}"
     "{{ 2 is in [1, 2] }}{{ 1 is eq 1 }}{{ 1 is equalto 2 }}{{ 'x' is lower }}{{ 'X' is upper }}{{ x is not defined }}"
     "{{ range is callable }}{{ 1 is ne 2 }}{{ 3 is gt 2 }}{{ 3 is le 2 }}", {}),
    ("str-methods",
     "{{ 'Hello'.startswith('He') }} {{ 'Hello'.endswith(('x', 'lo')) }} "
     "{{ '  x  '.strip() }}|{{ 'xxaxx'.lstrip('x') }}|{{ '\\n\\nt\\n'.rstrip('\\n') }}|{{ 'a,b,,c'.split(',') }} "
     "{{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a.b.c'.rsplit('.', 1) }} {{ 'aXbX'.replace('X', '-') }} "
     "{{ 'ab'.upper() }} {{ 'AB'.lower() }} {{ 'hello wORLD 1st'.title() }} {{ 'hELLO'.capitalize() }} "
     "{{ 'héllo'.find('l') }} {{ 'abc'.find('z') }} {{ 'banana'.count('an') }} {{ '{} and {}'.format(1, 'x') }} "
     "{{ '{0}{1}{0}'.format('a', 'b') }} {{ '{name}!'.format(name='N') }} {{ '-'.join(['a', 'b']) }} "
     "{{ '12'.isdigit() }} {{ 'ab'.isalpha() }}", {}),
    ("dict-methods",
     "{% set d = {'a': 1, 'b': none} %}{{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }} "
     "{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 5) }} {{ d.a }} [{{ d.zz }}] {{ d['b'] is none }} "
     "{{ d | length }} {{ dict(x=1, y='z') }} {{ dict(d, c=3) }}", {}),
    ("globals",
     "{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(5, 0, -2) | list }} "
     "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }} {{ strftime_now('%Y') | length }}", {}),
    ("undefined-attr-of-dict",
     "{% if messages[0].tool_calls is defined %}y{% else %}n{% endif %}{{ messages[0].nope is none }}"
     "{{ messages[0]['nope'] is defined }}{{ none.x is defined }}", {"messages": M}),
    ("content-parts",
     "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}"
     "{% if p.type == 'text' %}{{ p.text }}{% elif p.type == 'image' %}<img>{% endif %}{% endfor %}"
     "{% endif %}\n{% endfor %}",
     {"messages": [{"role": "user", "content": [{"type": "text", "text": "A"}, {"type": "image"}]},
                   {"role": "user", "content": "B"}]}),
    ("tools-none",
     "{{ tools is none }}{{ tools is defined }}{{ documents is none }}{{ add_generation_prompt }}"
     "{% if tools %}T{% endif %}", {}),
    ("reasoning-alias", "{% for m in messages %}{{ m | tojson }}\n{% endfor %}",
     {"messages": [{"role": "assistant", "content": "c", "reasoning": "r"},
                   {"role": "assistant", "content": "d", "thinking": "t", "x": 1},
                   {"role": "user", "content": "u", "reasoning_content": None}]}),
    ("print-values",
     "{{ [1.0, 'a\\'b', \"c\\\"d\", {'k': none}] }} {{ ('x', 1) }} {{ 1.5e300 * 10 }} {{ -0.0 }} "
     "{{ 100000000000000000.0 }} {{ 0.0001 }} {{ [true, false] }} {{ {1: 'x'} }}", {}),
    # error cases (transformers raises; tessera must fail too)
    ("err-raise", "{{ raise_exception('Bad conversation: ' ~ messages | length) }}", {"messages": M}),
    ("err-undefined-attr", "{{ nothing.attr }}", {}),
    ("err-type-add", "{{ 'a' + 1 }}", {}),
    ("err-iterate-none", "{% for x in none %}{% endfor %}", {}),
    ("err-list-append", "{% set l = [] %}{{ l.append(1) }}", {}),
    ("err-call-undefined", "{{ nofunc() }}", {}),
    ("err-div-zero", "{{ 1 // 0 }}", {}),
    ("err-macro-args", "{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}", {}),
    ("err-range-big", "{{ range(1000000) | length }}", {}),
    ("err-ns-assign", "{% set x = 1 %}{% set x.y = 2 %}", {}),
]


def render(template, inp):
    kw = dict(inp.get("extra") or {})
    for k in ("bos_token", "eos_token"):
        if inp.get(k) is not None:
            kw[k] = inp[k]
    try:
        out, _ = render_jinja_template(
            conversations=[inp["messages"]], tools=inp.get("tools"), chat_template=template,
            add_generation_prompt=inp.get("add_generation_prompt", False), **kw)
        return out[0], None
    except Exception as e:  # noqa: BLE001 - any failure is an expected-error case
        return None, f"{type(e).__name__}: {e}"


def build():
    cases = []
    for name, (convs, bos, eos, with_tools, extras) in TEMPLATES.items():
        src = open(os.path.join(TPL_DIR, name + ".jinja"), encoding="utf-8").read()
        for conv in convs:
            for tools in ([None, TOOLS] if with_tools else [None]):
                for extra in extras:
                    for gen in (False, True):
                        inp = {"messages": CONV[conv], "add_generation_prompt": gen}
                        if tools is not None:
                            inp["tools"] = tools
                        if bos is not None:
                            inp["bos_token"] = bos
                        if eos is not None:
                            inp["eos_token"] = eos
                        if extra:
                            inp["extra"] = extra
                        text, err = render(src, inp)
                        cname = (f"{name}/{conv}{'/tools' if tools else ''}"
                                 f"{'/' + json.dumps(extra, sort_keys=True) if extra else ''}"
                                 f"{'/gen' if gen else ''}")
                        case = {"name": cname, "template_file": name + ".jinja", "input": inp}
                        if err is None:
                            case["expected"] = text
                        else:
                            case["error"] = err
                        cases.append(case)
    for name, tpl, variables in MICRO:
        extra = {k: v for k, v in variables.items() if k != "messages"}
        inp = {"messages": variables.get("messages", M), "add_generation_prompt": False}
        if extra:
            inp["extra"] = extra
        text, err = render(tpl, inp)
        case = {"name": "micro/" + name, "template": tpl, "input": inp}
        if err is None:
            case["expected"] = text
        else:
            case["error"] = err
        cases.append(case)
    return {"generator": "scripts/make-template-refs.py (transformers render_jinja_template)", "cases": cases}


def main():
    data = build()
    text = json.dumps(data, ensure_ascii=False, indent=1) + "\n"
    if "--check" in sys.argv:
        old = open(OUT, encoding="utf-8").read()
        if old != text:
            print("template-refs.json differs from a fresh render", file=sys.stderr)
            return 1
        print("template-refs.json is up to date")
        return 0
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text)
    n_err = sum(1 for c in data["cases"] if "error" in c)
    print(f"wrote {OUT}: {len(data['cases'])} cases ({n_err} expected errors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
