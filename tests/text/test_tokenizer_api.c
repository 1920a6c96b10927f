/* Tokenizer API and errors: lookups and bos/eos of a folder, malformed and unsupported tokenizer.json files, invalid
 * UTF-8, missing files, and the streaming detokenizer's hold-back rules (text is emitted as soon as it is final). */
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

static char *write_tmp(const char *text)
{
    char *p = strdup("/tmp/tsr-tok-test-XXXXXX");
    int fd = mkstemp(p);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return p;
}

/* Loads the tiny tokenizer.json with one top-level key replaced by `value` (JSON text); returns the status. */
static tsr_status load_patched(const char *key, const char *value)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", tok_fixture_path("tiny"));
    json_t *j = json_load_file(path, 0, NULL);
    assert_non_null(j);
    json_t *v = json_loads(value, JSON_DECODE_ANY, NULL);
    assert_non_null(v);
    if (!strcmp(key, "model.type")) json_object_set_new(json_object_get(j, "model"), "type", v);
    else if (!strcmp(key, "model.merges")) json_object_set_new(json_object_get(j, "model"), "merges", v);
    else json_object_set_new(j, key, v);
    char *dump = json_dumps(j, 0);
    json_decref(j);
    char *tmp = write_tmp(dump);
    free(dump);
    tsr_tokenizer *tok = NULL;
    tsr_status st = tsr_tokenizer_load(tmp, &tok);
    tsr_tokenizer_free(tok);
    unlink(tmp);
    free(tmp);
    return st;
}

static void test_lookups(void **s)
{
    (void)s;
    tsr_tokenizer *tok;
    assert_int_equal(tsr_tokenizer_load(tok_fixture_path("tiny"), &tok), TSR_OK);
    assert_string_equal(tsr_tokenizer_bos_token(tok), "<|begin_of_text|>");
    assert_string_equal(tsr_tokenizer_eos_token(tok), "<|eot_id|>");
    assert_int_equal(tsr_tokenizer_token_id(tok, "<|begin_of_text|>"), 0);
    assert_int_equal(tsr_tokenizer_token_id(tok, "<|eot_id|>"), 4);
    assert_int_equal(tsr_tokenizer_token_id(tok, "no such token at all"), -1);
    assert_string_equal(tsr_tokenizer_token_str(tok, 0), "<|begin_of_text|>");
    assert_true(tsr_tokenizer_vocab_size(tok) >= 2048);
    assert_null(tsr_tokenizer_token_str(tok, -1));
    assert_null(tsr_tokenizer_token_str(tok, (int32_t)tsr_tokenizer_vocab_size(tok)));
    assert_true(tsr_tokenizer_is_special(tok, 0));
    assert_false(tsr_tokenizer_is_special(tok, 100));
    int32_t id = tsr_tokenizer_token_id(tok, tsr_tokenizer_token_str(tok, 100));
    assert_int_equal(id, 100);
    /* skip_special drops the BOS */
    int32_t *ids;
    size_t n;
    assert_int_equal(tsr_tokenizer_encode(tok, "hi there", 8, 1, &ids, &n), TSR_OK);
    assert_int_equal(ids[0], 0);
    char *text;
    size_t len;
    assert_int_equal(tsr_tokenizer_decode(tok, ids, n, 1, &text, &len), TSR_OK);
    assert_string_equal(text, "hi there");
    free(text);
    assert_int_equal(tsr_tokenizer_decode(tok, ids, n, 0, &text, &len), TSR_OK);
    assert_string_equal(text, "<|begin_of_text|>hi there");
    free(text);
    free(ids);
    /* empty input */
    assert_int_equal(tsr_tokenizer_encode(tok, "", 0, 0, &ids, &n), TSR_OK);
    assert_non_null(ids);
    assert_int_equal(n, 0);
    free(ids);
    tsr_tokenizer_free(tok);

    /* a folder whose tokenizer_config.json holds an integer beyond 64 bits, as Llama 3's does (model_max_length) */
    char dir[] = "/tmp/tsr-tok-dir-XXXXXX", path[4200], src[4200];
    assert_non_null(mkdtemp(dir));
    snprintf(src, sizeof src, "%s/tokenizer.json", tok_fixture_path("tiny"));
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *in = fopen(src, "rb"), *f = fopen(path, "wb");
    assert_non_null(in);
    assert_non_null(f);
    char chunk[65536];
    for (size_t got; (got = fread(chunk, 1, sizeof chunk, in)) > 0;) assert_int_equal(fwrite(chunk, 1, got, f), got);
    fclose(in), fclose(f);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"bos_token\": \"<|begin_of_text|>\", \"eos_token\": \"<|eot_id|>\",\n"
          " \"model_max_length\": 1000000000000000019884624838656}\n", f);
    fclose(f);
    assert_int_equal(tsr_tokenizer_load(dir, &tok), TSR_OK);
    assert_string_equal(tsr_tokenizer_eos_token(tok), "<|eot_id|>");
    tsr_tokenizer_free(tok);
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    unlink(path);
    rmdir(dir);

    /* a file path has no tokenizer_config.json: no bos/eos */
    assert_int_equal(tsr_tokenizer_load(tok_fixture_path("llama2"), &tok), TSR_OK);
    assert_null(tsr_tokenizer_bos_token(tok));
    assert_int_equal(tsr_tokenizer_token_id(tok, "<s>"), 1);
    assert_int_equal(tsr_tokenizer_token_id(tok, "<0x0A>"), 13);
    tsr_tokenizer_free(tok);
}

static void test_invalid_utf8(void **s)
{
    (void)s;
    tsr_tokenizer *tok;
    assert_int_equal(tsr_tokenizer_load(tok_fixture_path("llama3"), &tok), TSR_OK);
    static const char *bad[] = {"\xff", "abc\xc3", "\xed\xa0\x80 surrogate", "\xc0\xaf overlong", "\xf4\x90\x80\x80",
                                "ok \x80", "\xe2\x82"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int32_t *ids = (int32_t *)1;
        size_t n = 7;
        assert_int_equal(tsr_tokenizer_encode(tok, bad[i], strlen(bad[i]), 0, &ids, &n), TSR_ERR_ARG);
        assert_null(ids);
        assert_int_equal(n, 0);
        assert_non_null(strstr(tsr_last_error(), "UTF-8"));
    }
    /* NUL bytes are valid text */
    int32_t *ids;
    size_t n;
    assert_int_equal(tsr_tokenizer_encode(tok, "a\0b", 3, 0, &ids, &n), TSR_OK);
    assert_int_equal(n, 3);
    free(ids);
    tsr_tokenizer_free(tok);
}

static void test_bad_files(void **s)
{
    (void)s;
    tsr_tokenizer *tok = NULL;
    /* malformed JSON: format error with line and column */
    char *p = write_tmp("{\n  \"model\": {\"type\": \"BPE\",\n  \"vocab\": {\"a\": 0,}\n}\n");
    assert_int_equal(tsr_tokenizer_load(p, &tok), TSR_ERR_FORMAT);
    assert_null(tok);
    assert_non_null(strstr(tsr_last_error(), "line 3"));
    assert_non_null(strstr(tsr_last_error(), "column"));
    unlink(p);
    free(p);
    /* valid JSON, wrong shapes */
    p = write_tmp("[1, 2]");
    assert_int_equal(tsr_tokenizer_load(p, &tok), TSR_ERR_FORMAT);
    unlink(p);
    free(p);
    p = write_tmp("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"zero\"}, \"merges\": []}}");
    assert_int_equal(tsr_tokenizer_load(p, &tok), TSR_ERR_FORMAT);
    assert_non_null(strstr(tsr_last_error(), "model.vocab"));
    unlink(p);
    free(p);
    p = write_tmp("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}");
    assert_int_equal(tsr_tokenizer_load(p, &tok), TSR_ERR_FORMAT);
    assert_non_null(strstr(tsr_last_error(), "model.merges[0]"));
    unlink(p);
    free(p);
    /* a minimal valid one */
    p = write_tmp(
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [[\"a\", \"b\"]]}}");
    assert_int_equal(tsr_tokenizer_load(p, &tok), TSR_OK);
    int32_t *ids;
    size_t n;
    assert_int_equal(tsr_tokenizer_encode(tok, "abab", 4, 1, &ids, &n), TSR_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 2);
    free(ids);
    char *text;
    size_t len;
    int32_t two[2] = {0, 1};
    assert_int_equal(tsr_tokenizer_decode(tok, two, 2, 0, &text, &len), TSR_OK);
    assert_string_equal(text, "a b"); /* no decoder: joined with spaces */
    free(text);
    tsr_tokenizer_free(tok);
    unlink(p);
    free(p);

    /* unsupported components name their type */
    static const struct {
        const char *key, *value, *name;
    } unsup[] = {
        {"normalizer", "{\"type\": \"Precompiled\", \"precompiled_charsmap\": \"\"}", "Precompiled"},
        {"normalizer", "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"BertNormalizer\"}]}", "BertNormalizer"},
        {"pre_tokenizer", "{\"type\": \"BertPreTokenizer\"}", "BertPreTokenizer"},
        {"decoder", "{\"type\": \"WordPiece\", \"prefix\": \"##\"}", "WordPiece"},
        {"decoder", "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"CTC\"}]}", "CTC"},
        {"post_processor", "{\"type\": \"SomethingNew\"}", "SomethingNew"},
        {"model.type", "\"Unigram\"", "Unigram"},
        {"pre_tokenizer", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Sideways\"}",
         "Sideways"},
        {"pre_tokenizer", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(?<=a+)b\"}, \"behavior\": \"Isolated\"}",
         "regex"},
    };
    for (size_t i = 0; i < sizeof unsup / sizeof unsup[0]; i++) {
        assert_int_equal(load_patched(unsup[i].key, unsup[i].value), TSR_ERR_UNSUPPORTED);
        if (!strstr(tsr_last_error(), unsup[i].name))
            fail_msg("message without '%s': %s", unsup[i].name, tsr_last_error());
    }
    assert_int_equal(load_patched("pre_tokenizer", "{\"type\": 7}"), TSR_ERR_FORMAT);
    assert_int_equal(load_patched("model.merges", "[\"a b c\"]"), TSR_ERR_FORMAT);
    assert_int_equal(load_patched("added_tokens", "[{\"id\": -1, \"content\": \"x\"}]"), TSR_ERR_FORMAT);

    /* missing file and folder without tokenizer.json */
    assert_int_equal(tsr_tokenizer_load("/nonexistent/tokenizer.json", &tok), TSR_ERR_IO);
    assert_int_equal(tsr_tokenizer_load("/tmp", &tok), TSR_ERR_MISSING);
    assert_int_equal(tsr_tokenizer_load(NULL, &tok), TSR_ERR_ARG);
}

/* Pushes ids and returns the concatenated text emitted before the flush (caller frees). */
static char *stream_before_flush(const tsr_tokenizer *tok, const int32_t *ids, size_t n, char **after)
{
    tsr_detokenizer *d;
    assert_int_equal(tsr_detokenizer_new(tok, 0, &d), TSR_OK);
    char *acc = calloc(1, 65536);
    for (size_t i = 0; i < n; i++) {
        char *t;
        size_t l;
        assert_int_equal(tsr_detokenizer_push(d, ids[i], &t, &l), TSR_OK);
        strncat(acc, t, 65535 - strlen(acc));
    }
    char *t;
    size_t l;
    assert_int_equal(tsr_detokenizer_flush(d, &t, &l), TSR_OK);
    *after = strdup(t);
    tsr_detokenizer_free(d);
    return acc;
}

static void test_stream_holdback(void **s)
{
    (void)s;
    const char *names[3] = {"llama2", "llama3", "qwen3"};
    for (int k = 0; k < 3; k++) {
        tsr_tokenizer *tok;
        assert_int_equal(tsr_tokenizer_load(tok_fixture_path(names[k]), &tok), TSR_OK);
        /* plain text: everything is out before the flush */
        const char *plain = "Hello world, this is  a test.\nNew line!";
        int32_t *ids;
        size_t n;
        assert_int_equal(tsr_tokenizer_encode(tok, plain, strlen(plain), 0, &ids, &n), TSR_OK);
        char *after;
        char *before = stream_before_flush(tok, ids, n, &after);
        assert_string_equal(before, plain);
        assert_string_equal(after, "");
        free(before);
        free(after);
        free(ids);
        /* an emoji at the end: nothing partial before the flush, the whole text after it */
        const char *emoji = "ok \xf0\x9f\xa6\x99";
        assert_int_equal(tsr_tokenizer_encode(tok, emoji, strlen(emoji), 0, &ids, &n), TSR_OK);
        before = stream_before_flush(tok, ids, n, &after);
        size_t bl = strlen(before);
        assert_true(bl == 3 || bl == strlen(emoji)); /* "ok " then the emoji once complete */
        char joined[64];
        snprintf(joined, sizeof joined, "%s%s", before, after);
        assert_string_equal(joined, emoji);
        /* a truncated emoji decodes to U+FFFD, in both ways */
        assert_true(tok_check_stream(tok, ids, n - 1, 0, names[k]) == 0);
        free(before);
        free(after);
        free(ids);
        tsr_tokenizer_free(tok);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookups),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_stream_holdback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
