/* Helpers of the tokenizer tests: see tok_check.h. */
#include "tests/text/tok_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0;
}

const char *tok_fixture_file(const char *rel)
{
    static char buf[4096];
    const char *envs[2] = {"TSR_FIXTURES", "TSR_FIXTURES_BUILD"};
    for (int i = 0; i < 2; i++) {
        const char *root = getenv(envs[i]);
        if (!root) continue;
        snprintf(buf, sizeof buf, "%s/%s", root, rel);
        if (exists(buf)) return buf;
    }
    return NULL;
}

const char *tok_fixture_path(const char *name)
{
    static char buf[4096];
    if (!strcmp(name, "tiny")) {
        const char *m = getenv("TSR_MODELS");
        snprintf(buf, sizeof buf, "%s/tiny-llama-exl2-4.0bpw", m ? m : "models");
        return buf;
    }
    const char *b = getenv("TSR_FIXTURES_BUILD");
    snprintf(buf, sizeof buf, "%s/tokenizers/%s/tokenizer.json", b ? b : "build/fixtures", name);
    return buf;
}

static void print_ids(const char *label, const int32_t *ids, size_t n)
{
    fprintf(stderr, "    %s (%zu):", label, n);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

static int32_t *json_ids(json_t *a, size_t *n)
{
    *n = json_array_size(a);
    int32_t *v = malloc((*n ? *n : 1) * sizeof *v);
    for (size_t i = 0; i < *n; i++) v[i] = (int32_t)json_integer_value(json_array_get(a, i));
    return v;
}

static int check_ids(const tsr_tokenizer *tok, const char *text, size_t len, int special, json_t *want,
                     const char *what, const char *label)
{
    int32_t *ids = NULL;
    size_t n = 0, wn;
    if (!want) return 0;
    tsr_status st = tsr_tokenizer_encode(tok, text, len, special, &ids, &n);
    if (st) {
        fprintf(stderr, "%s: %s: encode failed: %s\n", what, label, tsr_last_error());
        return 1;
    }
    int32_t *w = json_ids(want, &wn);
    int bad = n != wn || (n && memcmp(ids, w, n * sizeof *ids));
    if (bad) {
        fprintf(stderr, "%s: %s differ for text \"%.80s\"\n", what, label, text);
        size_t i = 0;
        while (i < n && i < wn && ids[i] == w[i]) i++;
        fprintf(stderr, "    first difference at index %zu\n", i);
        print_ids("got ", ids + (i > 5 ? i - 5 : 0), n - (i > 5 ? i - 5 : 0));
        print_ids("want", w + (i > 5 ? i - 5 : 0), wn - (i > 5 ? i - 5 : 0));
    }
    free(ids);
    free(w);
    return bad;
}

int tok_check_stream(const tsr_tokenizer *tok, const int32_t *ids, size_t n, int skip_special, const char *what)
{
    char *full = NULL;
    size_t full_len = 0;
    if (tsr_tokenizer_decode(tok, ids, n, skip_special, &full, &full_len)) {
        fprintf(stderr, "%s: decode failed: %s\n", what, tsr_last_error());
        return 1;
    }
    tsr_detokenizer *d;
    if (tsr_detokenizer_new(tok, skip_special, &d)) {
        free(full);
        return 1;
    }
    char *acc = malloc(full_len * 2 + 64);
    size_t acc_len = 0, cap = full_len * 2 + 64;
    int bad = 0;
    for (size_t i = 0; i <= n && !bad; i++) {
        char *t;
        size_t l;
        tsr_status st = i < n ? tsr_detokenizer_push(d, ids[i], &t, &l) : tsr_detokenizer_flush(d, &t, &l);
        if (st) {
            fprintf(stderr, "%s: detokenizer failed: %s\n", what, tsr_last_error());
            bad = 1;
            break;
        }
        if (strlen(t) != l && memchr(t, 0, l) == NULL) bad = 1;
        /* every chunk must be whole UTF-8 characters */
        size_t j = 0;
        while (j < l) {
            unsigned char c = (unsigned char)t[j];
            size_t k = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
            if ((c >= 0x80 && c < 0xC2) || j + k > l) {
                fprintf(stderr, "%s: chunk %zu splits a UTF-8 character\n", what, i);
                bad = 1;
                break;
            }
            for (size_t q = 1; q < k; q++)
                if (((unsigned char)t[j + q] & 0xC0) != 0x80) {
                    fprintf(stderr, "%s: chunk %zu has invalid UTF-8\n", what, i);
                    bad = 1;
                }
            j += k;
        }
        if (acc_len + l > cap) {
            cap = (acc_len + l) * 2;
            acc = realloc(acc, cap);
        }
        memcpy(acc + acc_len, t, l);
        acc_len += l;
    }
    if (!bad && (acc_len != full_len || memcmp(acc, full, full_len))) {
        fprintf(stderr, "%s: streamed text differs from the full decode\n    stream: \"%.*s\"\n    full:   \"%.*s\"\n",
                what, (int)(acc_len > 200 ? 200 : acc_len), acc, (int)(full_len > 200 ? 200 : full_len), full);
        bad = 1;
    }
    tsr_detokenizer_free(d);
    free(acc);
    free(full);
    return bad;
}

int tok_check_entry(const tsr_tokenizer *tok, json_t *e, const char *what)
{
    json_t *jt = json_object_get(e, "text");
    const char *text = json_string_value(jt);
    size_t len = json_string_length(jt);
    int bad = 0;
    bad += check_ids(tok, text, len, 0, json_object_get(e, "ids"), what, "ids");
    bad += check_ids(tok, text, len, 1, json_object_get(e, "ids_with_special"), what, "ids_with_special");
    size_t n;
    int32_t *ids = json_ids(json_object_get(e, "ids"), &n);
    json_t *want = json_object_get(e, "decoded");
    char *dec = NULL;
    size_t dl = 0;
    if (tsr_tokenizer_decode(tok, ids, n, 0, &dec, &dl)) {
        fprintf(stderr, "%s: decode failed: %s\n", what, tsr_last_error());
        bad++;
    } else if (want && (dl != json_string_length(want) || memcmp(dec, json_string_value(want), dl))) {
        fprintf(stderr, "%s: decoded differs\n    got:  \"%.*s\"\n    want: \"%.200s\"\n", what,
                (int)(dl > 200 ? 200 : dl), dec, json_string_value(want));
        bad++;
    }
    free(dec);
    bad += tok_check_stream(tok, ids, n, 0, what);
    free(ids);
    json_t *ws = json_object_get(e, "ids_with_special");
    if (ws) {
        ids = json_ids(ws, &n);
        bad += tok_check_stream(tok, ids, n, 1, what);
        bad += tok_check_stream(tok, ids, n, 0, what);
        free(ids);
    }
    return bad;
}
