/* Tokenizer against Hugging Face tokenizers: every entry of tests/fixtures/reference/tokenizer-ref.json (llama2,
 * llama3, qwen3, tiny) must give the same ids, ids_with_special and decoded text, and the streaming detokenizer must
 * give the full decode. Also the extra references made by scripts/make-tokenizer-refs.py
 * (tests/fixtures/text/tokenizer-extra.json.xz): random Unicode, long and adversarial inputs, variants of the
 * fixture tokenizers with other components (patched tokenizer.json), and decode-only cases with random ids. */
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

static json_t *load_json(const char *rel)
{
    const char *p = tok_fixture_file(rel);
    if (!p) {
        fprintf(stderr, "fixture %s not found (TSR_FIXTURES / TSR_FIXTURES_BUILD)\n", rel);
        return NULL;
    }
    json_error_t err;
    json_t *j = json_load_file(p, JSON_ALLOW_NUL, &err);
    if (!j) fprintf(stderr, "%s: %s\n", p, err.text);
    return j;
}

static void check_reference(const char *name)
{
    json_t *ref = load_json("reference/tokenizer-ref.json");
    assert_non_null(ref);
    json_t *list = json_object_get(json_object_get(ref, "encodings"), name);
    assert_true(json_array_size(list) > 100);
    tsr_tokenizer *tok;
    tsr_status st = tsr_tokenizer_load(tok_fixture_path(name), &tok);
    if (st) fprintf(stderr, "%s\n", tsr_last_error());
    assert_int_equal(st, TSR_OK);
    int bad = 0;
    for (size_t i = 0; i < json_array_size(list); i++) {
        char what[64];
        snprintf(what, sizeof what, "%s[%zu]", name, i);
        bad += tok_check_entry(tok, json_array_get(list, i), what) ? 1 : 0;
    }
    fprintf(stderr, "%s: %zu entries, %d mismatching\n", name, json_array_size(list), bad);
    tsr_tokenizer_free(tok);
    json_decref(ref);
    assert_int_equal(bad, 0);
}

static void test_ref_llama2(void **s)
{
    (void)s;
    check_reference("llama2");
}
static void test_ref_llama3(void **s)
{
    (void)s;
    check_reference("llama3");
}
static void test_ref_qwen3(void **s)
{
    (void)s;
    check_reference("qwen3");
}
static void test_ref_tiny(void **s)
{
    (void)s;
    check_reference("tiny");
}

/* Writes base tokenizer.json with the keys of `patch` replaced (and model keys of patch.model merged). */
static char *patched_tokenizer(const char *base, json_t *patch)
{
    const char *bp = tok_fixture_path(base);
    char path[4096];
    if (!strcmp(base, "tiny")) {
        snprintf(path, sizeof path, "%s/tokenizer.json", bp);
        bp = path;
    }
    json_error_t err;
    json_t *j = json_load_file(bp, 0, &err);
    if (!j) return NULL;
    const char *key;
    json_t *v;
    json_object_foreach(patch, key, v)
    {
        if (!strcmp(key, "model")) {
            json_object_update(json_object_get(j, "model"), v);
        } else {
            json_object_set(j, key, v);
        }
    }
    char *out = strdup("/tmp/tsr-tok-variant-XXXXXX");
    int fd = mkstemp(out);
    if (fd < 0 || json_dump_file(j, out, 0)) {
        json_decref(j);
        free(out);
        return NULL;
    }
    close(fd);
    json_decref(j);
    return out;
}

static void test_extra(void **s)
{
    (void)s;
    json_t *ref = load_json("text/tokenizer-extra.json");
    assert_non_null(ref);
    json_t *sets = json_object_get(ref, "sets");
    assert_true(json_array_size(sets) >= 8);
    int bad_total = 0;
    size_t entries = 0;
    for (size_t si = 0; si < json_array_size(sets); si++) {
        json_t *set = json_array_get(sets, si);
        const char *name = json_string_value(json_object_get(set, "name"));
        const char *base = json_string_value(json_object_get(set, "base"));
        json_t *patch = json_object_get(set, "patch");
        char *tmp = NULL;
        const char *path = tok_fixture_path(base);
        if (patch) {
            tmp = patched_tokenizer(base, patch);
            assert_non_null(tmp);
            path = tmp;
        }
        tsr_tokenizer *tok;
        tsr_status st = tsr_tokenizer_load(path, &tok);
        if (st) fprintf(stderr, "%s: %s\n", name, tsr_last_error());
        assert_int_equal(st, TSR_OK);
        int bad = 0;
        json_t *list = json_object_get(set, "encodings");
        for (size_t i = 0; i < json_array_size(list); i++) {
            char what[128];
            snprintf(what, sizeof what, "%s[%zu]", name, i);
            bad += tok_check_entry(tok, json_array_get(list, i), what) ? 1 : 0;
        }
        json_t *decs = json_object_get(set, "decodes");
        for (size_t i = 0; i < json_array_size(decs); i++) {
            json_t *e = json_array_get(decs, i);
            json_t *ja = json_object_get(e, "ids");
            size_t n = json_array_size(ja);
            int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
            for (size_t k = 0; k < n; k++) ids[k] = (int32_t)json_integer_value(json_array_get(ja, k));
            int skip = json_is_true(json_object_get(e, "skip_special"));
            json_t *want = json_object_get(e, "text");
            char *dec = NULL;
            size_t dl = 0;
            char what[128];
            snprintf(what, sizeof what, "%s decode[%zu]", name, i);
            int b = 0;
            if (tsr_tokenizer_decode(tok, ids, n, skip, &dec, &dl)) {
                fprintf(stderr, "%s: %s\n", what, tsr_last_error());
                b = 1;
            } else if (dl != json_string_length(want) || memcmp(dec, json_string_value(want), dl)) {
                fprintf(stderr, "%s: differs\n    got:  \"%.*s\"\n    want: \"%.200s\"\n", what,
                        (int)(dl > 200 ? 200 : dl), dec, json_string_value(want));
                b = 1;
            }
            free(dec);
            b += tok_check_stream(tok, ids, n, skip, what);
            bad += b ? 1 : 0;
            free(ids);
        }
        entries += json_array_size(list) + json_array_size(decs);
        fprintf(stderr, "%s: %zu encodings, %zu decodes, %d mismatching\n", name, json_array_size(list),
                json_array_size(decs), bad);
        bad_total += bad;
        tsr_tokenizer_free(tok);
        if (tmp) {
            unlink(tmp);
            free(tmp);
        }
    }
    json_decref(ref);
    assert_true(entries > 500);
    assert_int_equal(bad_total, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ref_llama2), cmocka_unit_test(test_ref_llama3), cmocka_unit_test(test_ref_qwen3),
        cmocka_unit_test(test_ref_tiny),   cmocka_unit_test(test_extra),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
