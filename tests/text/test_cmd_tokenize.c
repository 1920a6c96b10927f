/* `tessera tokenize` (launcher/cmd_tokenize.c, linked here directly): the output for the strings of
 * tests/fixtures/reference/tokenizer-ref.json equals the reference for each tokenizer, and the exit codes are
 * 0 (ok, --help), 1 (runtime error) and 2 (usage). */
#include "launcher/commands.h"
#include "tests/text/tok_check.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

static int run(int argc, const char **argv)
{
    return tsr_cmd_tokenize(argc, (char **)argv);
}

static void check_name(const char *name)
{
    const char *rp = tok_fixture_file("reference/tokenizer-ref.json");
    assert_non_null(rp);
    json_t *ref = json_load_file(rp, 0, NULL);
    assert_non_null(ref);
    json_t *list = json_object_get(json_object_get(ref, "encodings"), name);
    json_t *inputs = json_array();
    for (size_t i = 0; i < json_array_size(list); i++)
        json_array_append(inputs, json_object_get(json_array_get(list, i), "text"));
    char in[] = "/tmp/tsr-tokcli-in-XXXXXX", out[] = "/tmp/tsr-tokcli-out-XXXXXX";
    close(mkstemp(in));
    close(mkstemp(out));
    assert_int_equal(json_dump_file(inputs, in, 0), 0);
    char tokpath[4096];
    snprintf(tokpath, sizeof tokpath, "%s", tok_fixture_path(name));
    const char *argv[] = {"tokenize", "--tokenizer", tokpath, "--input", in, "--output", out};
    assert_int_equal(run(7, argv), 0);
    json_t *got = json_load_file(out, 0, NULL);
    assert_non_null(got);
    assert_int_equal(json_array_size(got), json_array_size(list));
    int bad = 0;
    for (size_t i = 0; i < json_array_size(list); i++) {
        json_t *want = json_deep_copy(json_array_get(list, i));
        json_object_del(want, "text");
        if (!json_equal(want, json_array_get(got, i))) {
            fprintf(stderr, "%s[%zu]: tessera tokenize output differs from the reference\n", name, i);
            bad++;
        }
        json_decref(want);
    }
    unlink(in);
    unlink(out);
    json_decref(got);
    json_decref(inputs);
    json_decref(ref);
    assert_int_equal(bad, 0);
}

static void test_outputs(void **s)
{
    (void)s;
    check_name("llama2");
    check_name("llama3");
    check_name("qwen3");
    check_name("tiny");
}

static void test_exit_codes(void **s)
{
    (void)s;
    const char *help[] = {"tokenize", "--help"};
    assert_int_equal(run(2, help), 0);
    const char *none[] = {"tokenize"};
    assert_int_equal(run(1, none), 2);
    const char *unknown[] = {"tokenize", "--frobnicate", "x"};
    assert_int_equal(run(3, unknown), 2);
    const char *dangling[] = {"tokenize", "--tokenizer"};
    assert_int_equal(run(2, dangling), 2);
    const char *missing[] = {"tokenize", "--tokenizer", "/nonexistent", "--input", "/nonexistent.json", "--output",
                             "/tmp/x.json"};
    assert_int_equal(run(7, missing), 1);
    char tokpath[4096];
    snprintf(tokpath, sizeof tokpath, "%s", tok_fixture_path("tiny"));
    const char *bad_input[] = {"tokenize", "--tokenizer", tokpath, "--input", "/nonexistent.json", "--output",
                               "/tmp/x.json"};
    assert_int_equal(run(7, bad_input), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_outputs),
        cmocka_unit_test(test_exit_codes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
