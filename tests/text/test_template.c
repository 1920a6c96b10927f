/* Chat templates: every reference rendered by Hugging Face transformers must match byte for byte, bad and
 * unsupported templates must fail with the right status and template line, limits must stop runaway templates.
 *
 * References: $TSR_FIXTURES/text/template-refs.json (scripts/make-template-refs.py) and the "chat" section of
 * $TSR_FIXTURES/reference/tokenizer-ref.json (rendered from the fixture tokenizers' tokenizer_config.json). */
#include "runtime/text/chat_template.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *env_or_fail(const char *name)
{
    const char *v = getenv(name);
    if (!v) fail_msg("environment variable %s is not set (run through ctest)", name);
    return v;
}

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static json_t *load_json(const char *path)
{
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    if (!j) fail_msg("%s: %s (line %d)", path, e.text, e.line);
    return j;
}

/* Renders template src for a reference input object; returns status, *out the text. */
static tsr_status render_input(const char *src, const json_t *in, char **out)
{
    tsr_chat_template *t = NULL;
    *out = NULL;
    tsr_status st = tsr_chat_template_parse(src, &t);
    if (st) return st;
    st = tsr_chat_template_render(
        t, json_object_get(in, "messages"), json_object_get(in, "tools"),
        json_is_true(json_object_get(in, "add_generation_prompt")), json_string_value(json_object_get(in, "bos_token")),
        json_string_value(json_object_get(in, "eos_token")), json_object_get(in, "extra"), out);
    tsr_chat_template_free(t);
    return st;
}

static void show_diff(const char *name, const char *exp, const char *got)
{
    size_t i = 0;
    while (exp[i] && exp[i] == got[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "MISMATCH %s at byte %zu\n  expected: ...%.80s\n  got:      ...%.80s\n", name, i, exp + from,
            got + from);
}

static void test_transformers_refs(void **state)
{
    (void)state;
    char path[4096];
    snprintf(path, sizeof path, "%s/text/template-refs.json", env_or_fail("TSR_FIXTURES"));
    json_t *refs = load_json(path);
    json_t *cases = json_object_get(refs, "cases");
    assert_true(json_array_size(cases) > 100);
    int bad = 0, n_ok = 0, n_err = 0;
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        char *src;
        if (json_object_get(c, "template"))
            src = strdup(json_string_value(json_object_get(c, "template")));
        else {
            char tp[4096];
            snprintf(tp, sizeof tp, "%s/text/templates/%s", env_or_fail("TSR_FIXTURES"),
                     json_string_value(json_object_get(c, "template_file")));
            src = read_all(tp);
        }
        char *out = NULL;
        tsr_status st = render_input(src, json_object_get(c, "input"), &out);
        const char *exp = json_string_value(json_object_get(c, "expected"));
        if (exp) {
            if (st) {
                fprintf(stderr, "FAILED %s: %s\n", name, tsr_last_error());
                bad++;
            } else if (strcmp(out, exp)) {
                show_diff(name, exp, out);
                bad++;
            } else
                n_ok++;
        } else {
            if (st == TSR_OK) {
                fprintf(stderr, "SHOULD FAIL %s (transformers: %s)\n", name,
                        json_string_value(json_object_get(c, "error")));
                bad++;
            } else if (!strstr(tsr_last_error(), "template line")) {
                fprintf(stderr, "NO LINE in error of %s: %s\n", name, tsr_last_error());
                bad++;
            } else
                n_err++;
        }
        free(out);
        free(src);
    }
    fprintf(stderr, "transformers references: %d rendered identically, %d failed as expected, %d bad\n", n_ok, n_err,
            bad);
    json_decref(refs);
    assert_int_equal(bad, 0);
}

static void test_tokenizer_dirs(void **state)
{
    (void)state;
    char path[4096];
    const char *fx = env_or_fail("TSR_FIXTURES"), *models = env_or_fail("TSR_MODELS");
    snprintf(path, sizeof path, "%s/reference/tokenizer-ref.json", fx);
    json_t *ref = load_json(path);
    json_t *chat = json_object_get(ref, "chat");
    assert_non_null(chat);
    int bad = 0, total = 0;
    const char *name;
    json_t *cases;
    json_object_foreach(chat, name, cases) {
        char dir[4096];
        if (!strcmp(name, "tiny"))
            snprintf(dir, sizeof dir, "%s/tiny-llama-exl2-4.0bpw", models);
        else
            snprintf(dir, sizeof dir, "%s/tokenizers/%s", fx, name);
        tsr_chat_template *t;
        char *bos, *eos;
        tsr_status st = tsr_chat_template_load_dir(dir, 0, &t, &bos, &eos);
        if (st) fail_msg("%s: %s", dir, tsr_last_error());
        size_t i;
        json_t *c;
        json_array_foreach(cases, i, c) {
            char *out;
            st = tsr_chat_template_render(t, json_object_get(c, "messages"), NULL,
                                          json_is_true(json_object_get(c, "add_generation_prompt")), bos, eos, NULL,
                                          &out);
            total++;
            if (st) {
                fprintf(stderr, "FAILED %s #%zu: %s\n", name, i, tsr_last_error());
                bad++;
                continue;
            }
            const char *exp = json_string_value(json_object_get(c, "rendered"));
            if (strcmp(out, exp)) {
                show_diff(name, exp, out);
                bad++;
            }
            free(out);
        }
        free(bos);
        free(eos);
        tsr_chat_template_free(t);
    }
    json_decref(ref);
    assert_true(total >= 20);
    assert_int_equal(bad, 0);
}

/* ---- errors ---- */

typedef struct {
    const char *src;
    tsr_status status;
    int line;             /* expected "template line N" (0: not checked) */
    const char *contains; /* substring of the message */
} err_case;

static const err_case parse_errors[] = {
    {"{% if x %}never closed", TSR_ERR_FORMAT, 1, "endif"},
    {"a\nb\n{% for %}{% endfor %}", TSR_ERR_FORMAT, 3, "syntax error"},
    {"{{ x | nosuchfilter }}", TSR_ERR_FORMAT, 1, "nosuchfilter"},
    {"\n{{ x is nosuchtest }}", TSR_ERR_FORMAT, 2, "nosuchtest"},
    {"line1\n{% extends 'base.html' %}", TSR_ERR_UNSUPPORTED, 2, "extends"},
    {"{% include 'x' %}", TSR_ERR_UNSUPPORTED, 1, "include"},
    {"\n\n\n{% import 'x' as y %}", TSR_ERR_UNSUPPORTED, 4, "import"},
    {"{% block b %}{% endblock %}", TSR_ERR_UNSUPPORTED, 1, "block"},
    {"{% call f() %}x{% endcall %}", TSR_ERR_UNSUPPORTED, 1, "call"},
    {"{{ xs | groupby('a') }}", TSR_ERR_UNSUPPORTED, 1, "groupby"},
    {"{% for x in xs recursive %}{% endfor %}", TSR_ERR_UNSUPPORTED, 1, "recursive"},
    {"{{ f(*args) }}", TSR_ERR_UNSUPPORTED, 1, "*args"},
    {"{% set x | upper %}a{% endset %}", TSR_ERR_UNSUPPORTED, 1, "filtered block set"},
    {"{% endfor %}", TSR_ERR_FORMAT, 1, "endfor"},
    {"{% for x in y %}{% endif %}", TSR_ERR_FORMAT, 1, "endif"},
    {"x\n{% break %}", TSR_ERR_FORMAT, 2, "outside of a loop"},
    {"{{ 'unterminated }}", TSR_ERR_FORMAT, 1, "unterminated string"},
    {"ok\n{# never closed", TSR_ERR_FORMAT, 2, "comment"},
    {"{{ }}", TSR_ERR_FORMAT, 1, "expected"},
    {"{{ 1 + }}", TSR_ERR_FORMAT, 1, "expected"},
    {"{{ a. }}", TSR_ERR_FORMAT, 1, "after '.'"},
    {"{% raw %}x", TSR_ERR_FORMAT, 1, "endraw"},
    {"{{ x $ y }}", TSR_ERR_FORMAT, 1, "unexpected character"},
    {"{% frobnicate %}", TSR_ERR_FORMAT, 1, "unknown tag"},
    {"{{ 99999999999999999999 }}", TSR_ERR_FORMAT, 1, "too large"},
    {"{% set true = 1 %}", TSR_ERR_FORMAT, 1, "cannot assign"},
    {"{{ '\\x4' }}", TSR_ERR_FORMAT, 1, "escape"},
    {"{% macro m(a=1, b) %}{% endmacro %}", TSR_ERR_FORMAT, 1, "non-default"},
};

static const err_case render_errors[] = {
    {"x\n{{ raise_exception('Roles must alternate') }}", TSR_ERR_ARG, 2, "Roles must alternate"},
    {"{{ '%s' % 1 }}", TSR_ERR_UNSUPPORTED, 1, "printf-style"},
    {"\n\n{{ 'a'.zfill(3) }}", TSR_ERR_UNSUPPORTED, 3, "zfill"},
    {"{{ undefined_thing.attr }}", TSR_ERR_FORMAT, 1, "'undefined_thing' is undefined"},
    {"{{ messages[0].content + 1 }}", TSR_ERR_FORMAT, 1, "'str' and 'int'"},
    {"{% for m in messages %}\n{{ m.nope() }}{% endfor %}", TSR_ERR_FORMAT, 2, "nope"},
    {"{{ 1 / 0 }}", TSR_ERR_FORMAT, 1, "division by zero"},
    {"{% set l = [1] %}\n{{ l.append(2) }}", TSR_ERR_FORMAT, 2, "unsafe"},
    {"{% for x in 5 %}{% endfor %}", TSR_ERR_FORMAT, 1, "not iterable"},
    {"{{ loop.changed(1) }}", TSR_ERR_FORMAT, 1, "undefined"},
    {"{{ 9223372036854775807 + 1 }}", TSR_ERR_UNSUPPORTED, 1, "overflow"},
    {"{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", TSR_ERR_UNSUPPORTED, 1, "nested too deeply"},
    {"{{ 'a' < 1 }}", TSR_ERR_FORMAT, 1, "not supported"},
    {"{% set x = 1 %}{% set x.y = 2 %}", TSR_ERR_FORMAT, 1, "non-namespace"},
    {"{% set a, b = [1] %}", TSR_ERR_FORMAT, 1, "unpack"},
    {"{{ 'x' | tojson(indent=[]) }}", TSR_ERR_FORMAT, 1, "indent"},
    {"{{ undefined_thing | tojson }}", TSR_ERR_FORMAT, 1, "not JSON serializable"},
    {"{{ range(200000) | length }}", TSR_ERR_FORMAT, 1, "MAX_RANGE"},
    {"{{ '{:>4}'.format(1) }}", TSR_ERR_UNSUPPORTED, 1, "str.format"},
};

static void check_err(const err_case *e, tsr_status st)
{
    if (st != e->status)
        fail_msg("template %s: status %d (%s), expected %d; message: %s", e->src, st, tsr_status_str(st), e->status,
                 tsr_last_error());
    if (e->contains && !strstr(tsr_last_error(), e->contains))
        fail_msg("template %s: message '%s' lacks '%s'", e->src, tsr_last_error(), e->contains);
    if (e->line) {
        char want[64];
        snprintf(want, sizeof want, "(template line %d)", e->line);
        if (!strstr(tsr_last_error(), want))
            fail_msg("template %s: message '%s' lacks '%s'", e->src, tsr_last_error(), want);
    }
}

static void test_parse_errors(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof parse_errors / sizeof parse_errors[0]; i++) {
        tsr_chat_template *t = (tsr_chat_template *)1;
        tsr_status st = tsr_chat_template_parse(parse_errors[i].src, &t);
        assert_null(t);
        check_err(&parse_errors[i], st);
    }
}

static json_t *one_message(void)
{
    return json_pack("[{s:s, s:s}]", "role", "user", "content", "hi");
}

static void test_render_errors(void **state)
{
    (void)state;
    json_t *msgs = one_message();
    for (size_t i = 0; i < sizeof render_errors / sizeof render_errors[0]; i++) {
        tsr_chat_template *t;
        tsr_status st = tsr_chat_template_parse(render_errors[i].src, &t);
        if (st) fail_msg("template %s: parse failed: %s", render_errors[i].src, tsr_last_error());
        char *out = (char *)1;
        st = tsr_chat_template_render(t, msgs, NULL, 0, NULL, NULL, NULL, &out);
        assert_null(out);
        check_err(&render_errors[i], st);
        tsr_chat_template_free(t);
    }
    json_decref(msgs);
}

static void test_limits(void **state)
{
    (void)state;
    tsr_chat_template_set_limits(16u << 20, 2000000);
    static const char *const runaway[] = {
        "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | "
        "length }}",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{{ 'x' * 100000000000 }}",
    };
    json_t *msgs = one_message();
    for (size_t i = 0; i < sizeof runaway / sizeof runaway[0]; i++) {
        tsr_chat_template *t;
        assert_int_equal(tsr_chat_template_parse(runaway[i], &t), TSR_OK);
        char *out = NULL;
        tsr_status st = tsr_chat_template_render(t, msgs, NULL, 0, NULL, NULL, NULL, &out);
        if (st != TSR_ERR_NOMEM) fail_msg("runaway template %zu: status %d (%s)", i, st, tsr_last_error());
        assert_null(out);
        tsr_chat_template_free(t);
    }
    tsr_chat_template_set_limits(0, 0);
    /* deep nesting is an error, not a stack overflow */
    size_t depth = 5000;
    char *deep = malloc(depth * 2 + 16);
    strcpy(deep, "{{ ");
    for (size_t i = 0; i < depth; i++) strcat(deep, "(");
    strcat(deep, "1");
    for (size_t i = 0; i < depth; i++) strcat(deep, ")");
    strcat(deep, " }}");
    tsr_chat_template *t = NULL;
    assert_int_equal(tsr_chat_template_parse(deep, &t), TSR_ERR_UNSUPPORTED);
    assert_non_null(strstr(tsr_last_error(), "nested too deeply"));
    free(deep);
    json_decref(msgs);
}

/* ---- API: load_dir variants, bad inputs ---- */

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_load_dir(void **state)
{
    (void)state;
    char dir[] = "/tmp/tsr-template-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    write_file(cfg, "{\"bos_token\": {\"content\": \"<B>\", \"lstrip\": false}, \"eos_token\": \"<E>\","
                    " \"chat_template\": [{\"name\": \"default\", \"template\": \"D{{ bos_token }}{{ eos_token }}{{ "
                    "tools is none }}\"},"
                    " {\"name\": \"tool_use\", \"template\": \"T{{ tools | length }}\"}]}");
    json_t *msgs = one_message(), *tools = json_pack("[{s:s}]", "type", "function");
    tsr_chat_template *t;
    char *bos, *eos, *out;
    assert_int_equal(tsr_chat_template_load_dir(dir, 0, &t, &bos, &eos), TSR_OK);
    assert_string_equal(bos, "<B>");
    assert_string_equal(eos, "<E>");
    assert_int_equal(tsr_chat_template_render(t, msgs, NULL, 0, bos, eos, NULL, &out), TSR_OK);
    assert_string_equal(out, "D<B><E>True");
    free(out);
    tsr_chat_template_free(t);
    free(bos);
    free(eos);
    assert_int_equal(tsr_chat_template_load_dir(dir, 1, &t, NULL, NULL), TSR_OK);
    assert_int_equal(tsr_chat_template_render(t, msgs, tools, 0, NULL, NULL, NULL, &out), TSR_OK);
    assert_string_equal(out, "T1");
    free(out);
    tsr_chat_template_free(t);

    /* extra variables override, bos undefined when NULL */
    json_t *extra = json_pack("{s:b, s:i}", "enable_thinking", 0, "n", 3);
    assert_int_equal(tsr_chat_template_parse("{{ enable_thinking }}{{ n * 2 }}{{ bos_token is defined }}", &t), TSR_OK);
    assert_int_equal(tsr_chat_template_render(t, msgs, NULL, 1, NULL, NULL, extra, &out), TSR_OK);
    assert_string_equal(out, "False6False");
    free(out);
    /* bad inputs */
    json_t *notarr = json_object(), *badmsg = json_pack("[s]", "hello");
    assert_int_equal(tsr_chat_template_render(t, notarr, NULL, 0, NULL, NULL, NULL, &out), TSR_ERR_ARG);
    assert_int_equal(tsr_chat_template_render(t, badmsg, NULL, 0, NULL, NULL, NULL, &out), TSR_ERR_ARG);
    assert_int_equal(tsr_chat_template_render(t, msgs, notarr, 0, NULL, NULL, NULL, &out), TSR_ERR_ARG);
    tsr_chat_template_free(t);

    /* no template at all; then chat_template.jinja next to the config */
    write_file(cfg, "{\"eos_token\": null}");
    assert_int_equal(tsr_chat_template_load_dir(dir, 0, &t, NULL, NULL), TSR_ERR_MISSING);
    char jpath[512];
    snprintf(jpath, sizeof jpath, "%s/chat_template.jinja", dir);
    write_file(jpath, "J{{ messages | length }}\n");
    assert_int_equal(tsr_chat_template_load_dir(dir, 0, &t, &bos, &eos), TSR_OK);
    assert_null(bos);
    assert_null(eos);
    assert_int_equal(tsr_chat_template_render(t, msgs, NULL, 0, NULL, NULL, NULL, &out), TSR_OK);
    assert_string_equal(out, "J1");
    free(out);
    tsr_chat_template_free(t);
    /* syntax error inside the config's template names the file and the line */
    write_file(cfg, "{\"chat_template\": \"ok\\n{% if %}\"}");
    assert_int_equal(tsr_chat_template_load_dir(dir, 0, &t, NULL, NULL), TSR_ERR_FORMAT);
    assert_non_null(strstr(tsr_last_error(), "tokenizer_config.json"));
    assert_non_null(strstr(tsr_last_error(), "template line 2"));
    write_file(cfg, "{not json");
    assert_int_equal(tsr_chat_template_load_dir(dir, 0, &t, NULL, NULL), TSR_ERR_FORMAT);
    unlink(jpath);
    unlink(cfg);
    rmdir(dir);
    assert_int_equal(tsr_chat_template_load_dir(dir, 0, &t, NULL, NULL), TSR_ERR_IO);
    json_decref(msgs);
    json_decref(tools);
    json_decref(extra);
    json_decref(notarr);
    json_decref(badmsg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transformers_refs), cmocka_unit_test(test_tokenizer_dirs),
        cmocka_unit_test(test_parse_errors),      cmocka_unit_test(test_render_errors),
        cmocka_unit_test(test_limits),            cmocka_unit_test(test_load_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
