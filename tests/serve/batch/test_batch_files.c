/* Unit tests of tessera batch's file handling, with no model: the id set, the input line checks (every error code,
 * blank lines, CRLF, a last line without newline), the resume index (results, duplicate errors, unidentified
 * lines, a cut last line, NUL-filled tail lines, damage in the middle) and the writer (whole lines, the
 * cut-to-good-length on open, a write failing halfway leaves only whole lines and refuses more). */
#include "launcher/batch_idset.h"
#include "launcher/batch_input.h"
#include "launcher/batch_resume.h"
#include "launcher/batch_writer.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

static char dir[] = "/tmp/tsr_batch_files_XXXXXX";

static const char *path_of(const char *name)
{
    static char buf[256];
    snprintf(buf, sizeof buf, "%s/%s", dir, name);
    return buf;
}

static void write_file(const char *name, const char *data, size_t len)
{
    FILE *f = fopen(path_of(name), "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

static char *read_file(const char *name, size_t *len)
{
    FILE *f = fopen(path_of(name), "rb");
    assert_non_null(f);
    char *buf = calloc(1, 1 << 16);
    *len = fread(buf, 1, (1 << 16) - 1, f);
    fclose(f);
    return buf;
}

static void test_idset(void **state)
{
    (void)state;
    tsr_idset s = {0};
    tsr_idset_entry *e;
    char key[32];
    for (int i = 0; i < 10000; i++) {
        int n = snprintf(key, sizeof key, "id-%d", i);
        assert_int_equal(tsr_idset_get(&s, key, (size_t)n, 1, &e), TSR_OK);
        e->count = i;
    }
    assert_int_equal(s.n, 10000);
    for (int i = 0; i < 10000; i += 7) {
        int n = snprintf(key, sizeof key, "id-%d", i);
        assert_int_equal(tsr_idset_get(&s, key, (size_t)n, 0, &e), TSR_OK);
        assert_non_null(e);
        assert_int_equal(e->count, i);
    }
    assert_int_equal(tsr_idset_get(&s, "id-10000", 8, 0, &e), TSR_OK);
    assert_null(e);
    /* keys are byte strings: "a\0b" and "a" differ */
    assert_int_equal(tsr_idset_get(&s, "a\0b", 3, 1, &e), TSR_OK);
    e->done = 1;
    assert_int_equal(tsr_idset_get(&s, "a", 1, 0, &e), TSR_OK);
    assert_null(e);
    tsr_idset_free(&s);
    tsr_idset_free(NULL);
}

static void test_input_lines(void **state)
{
    (void)state;
    const char *text = "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{}}\n"
                       "\n   \r\n"
                       "{bad\n"
                       "{\"custom_id\":\"b\",\"method\":\"GET\",\"url\":\"/v1/completions\",\"body\":{}}\r\n"
                       "{\"custom_id\":\"c\",\"method\":\"POST\",\"url\":\"/v1/x\",\"body\":{}}\n"
                       "{\"custom_id\":\"d\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\"}\n"
                       "[1]\n"
                       "{\"custom_id\":5,\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{}}\n"
                       "{\"custom_id\":\"e\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":[]}\n"
                       "{\"method\":\"POST\"}\n"
                       "{\"custom_id\":\"f\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"x\":1}}";
    write_file("in.jsonl", text, strlen(text));
    struct {
        long line;
        const char *id, *code;
        tsr_batch_url url;
    } want[] = {
        {1, "a", NULL, TSR_BATCH_URL_COMPLETIONS},
        {4, NULL, "invalid_json_line", TSR_BATCH_URL_NONE},
        {5, "b", "invalid_method", TSR_BATCH_URL_NONE},
        {6, "c", "invalid_url", TSR_BATCH_URL_NONE},
        {7, "d", "missing_required_parameter", TSR_BATCH_URL_CHAT},
        {8, NULL, "invalid_json_line", TSR_BATCH_URL_NONE},
        {9, NULL, "invalid_custom_id", TSR_BATCH_URL_NONE},
        {10, "e", "invalid_body", TSR_BATCH_URL_COMPLETIONS},
        {11, NULL, "missing_required_parameter", TSR_BATCH_URL_NONE},
        {12, "f", NULL, TSR_BATCH_URL_CHAT},
    };
    tsr_batch_reader *r;
    assert_int_equal(tsr_batch_reader_open(path_of("in.jsonl"), &r), TSR_OK);
    tsr_batch_line ln = {0};
    int eof = 0;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        assert_int_equal(tsr_batch_reader_next(r, &ln, &eof), TSR_OK);
        assert_int_equal(eof, 0);
        assert_int_equal(ln.line_no, want[i].line);
        if (want[i].id)
            assert_string_equal(ln.custom_id, want[i].id);
        else
            assert_null(ln.custom_id);
        if (want[i].code) {
            assert_non_null(ln.err_code);
            assert_string_equal(ln.err_code, want[i].code);
            assert_true(strlen(ln.err_msg) > 0);
        } else {
            assert_null(ln.err_code);
            assert_true(json_is_object(ln.body));
        }
        assert_int_equal(ln.url, want[i].url);
    }
    assert_int_equal(tsr_batch_reader_next(r, &ln, &eof), TSR_OK);
    assert_int_equal(eof, 1);
    assert_int_equal(tsr_batch_reader_offset(r), (long long)strlen(text));
    tsr_batch_line_clear(&ln);
    tsr_batch_reader_close(r);
    assert_int_equal(tsr_batch_reader_open(path_of("missing.jsonl"), &r), TSR_ERR_IO);
}

static const char *L1 =
    "{\"id\":\"batch_req_1\",\"custom_id\":\"a\",\"response\":{\"status_code\":200},\"error\":null}";
static const char *L2 = "{\"id\":\"batch_req_2\",\"custom_id\":\"a\",\"response\":null,"
                        "\"error\":{\"code\":\"duplicate_custom_id\",\"message\":\"m\",\"line\":3}}";
static const char *L3 = "{\"id\":\"batch_req_3\",\"custom_id\":null,\"response\":null,"
                        "\"error\":{\"code\":\"invalid_json_line\",\"message\":\"m\",\"line\":4}}";
static const char *L4 = "{\"id\":\"batch_req_4\",\"custom_id\":\"b\",\"response\":null,"
                        "\"error\":{\"code\":\"invalid_url\",\"message\":\"m\",\"line\":5}}";

static void test_resume(void **state)
{
    (void)state;
    char buf[2048];
    int n = snprintf(buf, sizeof buf, "%s\n%s\n%s\n%s\n{\"custom_id\":\"c\",\"resp", L1, L2, L3, L4);
    write_file("out.jsonl", buf, (size_t)n);
    tsr_batch_done d;
    assert_int_equal(tsr_batch_done_load(path_of("out.jsonl"), &d), TSR_OK);
    assert_int_equal(d.n_lines, 4);
    long long good = (long long)(strlen(L1) + strlen(L2) + strlen(L3) + strlen(L4) + 4);
    assert_int_equal(d.good_bytes, good);
    assert_int_equal(d.dropped_bytes, n - good);
    tsr_idset_entry *e;
    assert_int_equal(tsr_idset_get(&d.ids, "a", 1, 0, &e), TSR_OK);
    assert_non_null(e);
    assert_int_equal(e->done, 1);
    assert_int_equal(e->count, 1);
    assert_int_equal(tsr_idset_get(&d.ids, "b", 1, 0, &e), TSR_OK);
    assert_int_equal(e->done, 1);
    assert_int_equal(tsr_idset_get(&d.ids, "c", 1, 0, &e), TSR_OK);
    assert_null(e);
    assert_int_equal(tsr_idset_get(&d.lines, "4", 1, 0, &e), TSR_OK);
    assert_non_null(e);
    tsr_batch_done_free(&d);

    /* NUL blocks after a power loss: dropped like a cut line */
    n = snprintf(buf, sizeof buf, "%s\n", L1);
    memcpy(buf + n, "\0\0\0\n\0\0", 6);
    write_file("nul.jsonl", buf, (size_t)n + 6);
    assert_int_equal(tsr_batch_done_load(path_of("nul.jsonl"), &d), TSR_OK);
    assert_int_equal(d.good_bytes, n);
    assert_int_equal(d.dropped_bytes, 6);
    tsr_batch_done_free(&d);

    /* damage followed by good lines: not ours */
    n = snprintf(buf, sizeof buf, "%s\ngarbage\n%s\n", L1, L4);
    write_file("mid.jsonl", buf, (size_t)n);
    assert_int_equal(tsr_batch_done_load(path_of("mid.jsonl"), &d), TSR_ERR_FORMAT);
    assert_non_null(strstr(tsr_last_error(), "line 2"));

    /* a missing file is a fresh start */
    assert_int_equal(tsr_batch_done_load(path_of("none.jsonl"), &d), TSR_OK);
    assert_int_equal(d.n_lines, 0);
    assert_int_equal(d.good_bytes, 0);
    tsr_batch_done_free(&d);
}

static void test_writer(void **state)
{
    (void)state;
    write_file("w.jsonl", "whole\npartial", 13);
    tsr_batch_writer *w;
    assert_int_equal(tsr_batch_writer_open(path_of("w.jsonl"), 6, &w), TSR_OK);
    assert_int_equal(tsr_batch_writer_put(w, L1, strlen(L1)), TSR_OK);
    assert_int_equal(tsr_batch_writer_put(w, "a\nb", 3), TSR_ERR_INTERNAL); /* never a newline inside */
    assert_int_equal(tsr_batch_writer_lines(w), 1);
    assert_int_equal(tsr_batch_writer_close(w), TSR_OK);
    size_t len;
    char *got = read_file("w.jsonl", &len);
    char want[512];
    int n = snprintf(want, sizeof want, "whole\n%s\n", L1);
    assert_int_equal(len, (size_t)n);
    assert_memory_equal(got, want, len);
    free(got);

    setenv("TSR_TEST_WRITE_FAIL_AFTER", "2", 1);
    assert_int_equal(tsr_batch_writer_open(path_of("f.jsonl"), 0, &w), TSR_OK);
    assert_int_equal(tsr_batch_writer_put(w, L1, strlen(L1)), TSR_OK);
    assert_int_equal(tsr_batch_writer_put(w, L2, strlen(L2)), TSR_OK);
    assert_int_equal(tsr_batch_writer_put(w, L3, strlen(L3)), TSR_ERR_IO);
    assert_non_null(strstr(tsr_last_error(), "No space left"));
    assert_int_equal(tsr_batch_writer_put(w, L4, strlen(L4)), TSR_ERR_IO); /* sticky */
    tsr_batch_writer_close(w);
    unsetenv("TSR_TEST_WRITE_FAIL_AFTER");
    got = read_file("f.jsonl", &len);
    n = snprintf(want, sizeof want, "%s\n%s\n", L1, L2);
    assert_int_equal(len, (size_t)n);
    assert_memory_equal(got, want, len);
    free(got);
    assert_int_equal(tsr_batch_writer_open("/nonexistent-dir/x.jsonl", 0, &w), TSR_ERR_IO);
}

int main(void)
{
    if (!mkdtemp(dir)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idset),
        cmocka_unit_test(test_input_lines),
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_writer),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) rc = rc ? rc : 1;
    return rc;
}
