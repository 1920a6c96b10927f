/* Stop strings over streamed pieces (runtime/text/stop_match.c): every way of cutting a text into two or three
 * pieces (and byte by byte) must release the same text and report the same stop as the whole text at once;
 * overlapping stops; prefixes that turn out not to be stops; multi-byte UTF-8 (released chunks never end inside
 * a character); flush; bad arguments. A randomized comparison against a whole-text reference covers the rest. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "runtime/text/stop_match.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Result of streaming `text` cut at the given positions (ascending, inside the text). */
typedef struct {
    char out[512];
    size_t len;
    int matched, which;
} streamed;

/* A released chunk must not end inside a UTF-8 character: its last lead byte announces no more bytes than follow
 * it in the chunk. (Only for chunks of valid UTF-8 text.) */
static int ends_on_char(const char *s, size_t len)
{
    for (size_t k = 1; k <= 4 && k <= len; k++) {
        unsigned char c = (unsigned char)s[len - k];
        if ((c & 0xC0) == 0x80) continue;
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need <= k;
    }
    return 1;
}

static streamed run(const char *const *stops, int n_stops, const char *text, size_t tlen, const size_t *cuts,
                    int n_cuts, int check_utf8)
{
    streamed r = {.which = -1};
    tsr_stop_matcher *m;
    assert_int_equal(tsr_stop_matcher_new(stops, n_stops, &m), TSR_OK);
    size_t at = 0;
    for (int c = 0; c <= n_cuts; c++) {
        size_t end = c < n_cuts ? cuts[c] : tlen;
        const char *out;
        size_t out_len;
        int matched = -1;
        assert_int_equal(tsr_stop_push(m, text + at, end - at, &out, &out_len, &matched), TSR_OK);
        assert_true(matched == 0 || matched == 1);
        if (r.matched) assert_int_equal(out_len, 0); /* nothing after a match */
        if (check_utf8 && out_len && !ends_on_char(out, out_len)) fail_msg("a released chunk splits a character");
        assert_true(r.len + out_len < sizeof r.out);
        memcpy(r.out + r.len, out, out_len);
        r.len += out_len;
        r.matched = matched;
        at = end;
    }
    const char *out;
    size_t out_len;
    assert_int_equal(tsr_stop_flush(m, &out, &out_len), TSR_OK);
    if (r.matched) assert_int_equal(out_len, 0);
    memcpy(r.out + r.len, out, out_len);
    r.len += out_len;
    r.which = tsr_stop_which(m);
    assert_int_equal(r.which >= 0, r.matched);
    tsr_stop_matcher_free(m);
    return r;
}

/* Every cut into one, two and three pieces, and byte by byte, gives want / want_which. */
static void all_cuts(const char *const *stops, int n_stops, const char *text, const char *want, int want_which)
{
    size_t tlen = strlen(text), wlen = strlen(want);
    size_t cuts[512];
    for (size_t i = 0; i <= tlen; i++)
        for (size_t j = i; j <= tlen; j++) {
            size_t cc[2] = {i, j};
            streamed r = run(stops, n_stops, text, tlen, cc, 2, 1);
            if (r.len != wlen || memcmp(r.out, want, wlen) != 0 || r.which != want_which)
                fail_msg("'%s' cut at %zu,%zu: released '%.*s' (stop %d), want '%s' (stop %d)", text, i, j, (int)r.len,
                         r.out, r.which, want, want_which);
        }
    assert_true(tlen < 512);
    for (size_t i = 0; i < tlen; i++) cuts[i] = i + 1;
    streamed r = run(stops, n_stops, text, tlen, cuts, tlen ? (int)tlen - 1 : 0, 1);
    if (r.len != wlen || memcmp(r.out, want, wlen) != 0 || r.which != want_which)
        fail_msg("'%s' byte by byte: released '%.*s' (stop %d), want '%s'", text, (int)r.len, r.out, r.which, want);
}

static void test_split_everywhere(void **state)
{
    (void)state;
    const char *end[] = {"<END>"};
    all_cuts(end, 1, "abc<END>def", "abc", 0);
    all_cuts(end, 1, "<END>", "", 0);
    all_cuts(end, 1, "no stop here <EN", "no stop here <EN", -1);
    all_cuts(end, 1, "<<END<END>", "<<END", 0);
    const char *two[] = {"\n\nUser:", "###"};
    all_cuts(two, 2, "Sure.\n\nUs\n\nUser: hi", "Sure.\n\nUs", 0);
    all_cuts(two, 2, "a ## b ### c", "a ## b ", 1);
}

static void test_prefix_released(void **state)
{
    (void)state;
    const char *s[] = {"</s>"};
    tsr_stop_matcher *m;
    assert_int_equal(tsr_stop_matcher_new(s, 1, &m), TSR_OK);
    const char *out;
    size_t len;
    int matched;
    assert_int_equal(tsr_stop_push(m, "a</", 3, &out, &len, &matched), TSR_OK);
    assert_int_equal(len, 1); /* "</" could still become "</s>" */
    assert_memory_equal(out, "a", 1);
    assert_int_equal(tsr_stop_push(m, "b>", 2, &out, &len, &matched), TSR_OK);
    assert_int_equal(len, 4); /* it did not: released */
    assert_memory_equal(out, "</b>", 4);
    assert_int_equal(matched, 0);
    assert_int_equal(tsr_stop_push(m, "<", 1, &out, &len, &matched), TSR_OK);
    assert_int_equal(len, 0);
    assert_int_equal(tsr_stop_flush(m, &out, &len), TSR_OK); /* the end: what was held is text */
    assert_int_equal(len, 1);
    assert_memory_equal(out, "<", 1);
    assert_int_equal(tsr_stop_which(m), -1);
    /* after a flush the matcher goes on; then a match; then nothing more */
    assert_int_equal(tsr_stop_push(m, "x</s", 4, &out, &len, &matched), TSR_OK);
    assert_int_equal(len, 1);
    assert_int_equal(tsr_stop_push(m, ">tail", 5, &out, &len, &matched), TSR_OK);
    assert_int_equal(len, 0);
    assert_int_equal(matched, 1);
    assert_int_equal(tsr_stop_which(m), 0);
    assert_int_equal(tsr_stop_push(m, "more", 4, &out, &len, &matched), TSR_OK);
    assert_int_equal(len, 0);
    assert_int_equal(matched, 1);
    assert_int_equal(tsr_stop_flush(m, &out, &len), TSR_OK);
    assert_int_equal(len, 0);
    tsr_stop_matcher_free(m);
}

static void test_overlapping(void **state)
{
    (void)state;
    /* the stop that ends first wins, wherever it starts */
    const char *a[] = {"abcd", "bc"};
    all_cuts(a, 2, "xxabcdyy", "xxa", 1);
    /* two stops end on the same byte: the one that starts first (the longer) */
    const char *b[] = {"bc", "abc"};
    all_cuts(b, 2, "xxabcyy", "xx", 1);
    const char *b2[] = {"abc", "bc"};
    all_cuts(b2, 2, "xxabcyy", "xx", 0);
    /* a stop that overlaps itself */
    const char *c[] = {"aab"};
    all_cuts(c, 1, "aaab", "a", 0);
    all_cuts(c, 1, "aaaab", "aa", 0);
    const char *d[] = {"abab"};
    all_cuts(d, 1, "ababab!", "", 0);
    all_cuts(d, 1, "abaabab!", "aba", 0);
    /* a stop inside another one's prefix: the short one completes first */
    const char *e[] = {"hello world", "lo"};
    all_cuts(e, 2, "say hello world", "say hel", 1);
    /* duplicates: the first listed */
    const char *f[] = {"zz", "zz"};
    all_cuts(f, 2, "azzb", "a", 0);
}

static void test_utf8(void **state)
{
    (void)state;
    const char *s[] = {"é!"};
    all_cuts(s, 1, "café!", "caf", 0);
    all_cuts(s, 1, "café?", "café?", -1);
    const char *bang[] = {"!"};
    all_cuts(bang, 1, "日本語です!", "日本語です", 0);
    all_cuts(bang, 1, "🙂🙃 ok", "🙂🙃 ok", -1);
    /* no stops: pieces that end inside a character are held until it completes */
    all_cuts(NULL, 0, "añ日🙂z", "añ日🙂z", -1);
    const char *out;
    size_t len;
    int matched;
    tsr_stop_matcher *m;
    assert_int_equal(tsr_stop_matcher_new(NULL, 0, &m), TSR_OK);
    assert_int_equal(tsr_stop_push(m, "ab\xE6\x97", 4, &out, &len, &matched), TSR_OK);
    assert_int_equal(len, 2);
    assert_int_equal(tsr_stop_push(m, "\xA5", 1, &out, &len, &matched), TSR_OK);
    assert_int_equal(len, 3);
    assert_memory_equal(out, "日", 3);
    /* an incomplete character at the very end is released by the flush as it is */
    assert_int_equal(tsr_stop_push(m, "\xF0\x9F", 2, &out, &len, &matched), TSR_OK);
    assert_int_equal(len, 0);
    assert_int_equal(tsr_stop_flush(m, &out, &len), TSR_OK);
    assert_int_equal(len, 2);
    /* malformed bytes are not held */
    assert_int_equal(tsr_stop_push(m, "\x80x\xFF", 3, &out, &len, &matched), TSR_OK);
    assert_int_equal(len, 3);
    tsr_stop_matcher_free(m);
    /* a stop that starts inside a character (a continuation byte): the character is not released in part */
    const char *cont[] = {"\xA9"};
    all_cuts(cont, 1, "café", "caf", 0);
    /* a prefix of a multi-byte stop held across a character boundary, then released */
    const char *jp[] = {"です。"};
    all_cuts(jp, 1, "日本ですか", "日本ですか", -1);
    all_cuts(jp, 1, "日本です。次", "日本", 0);
}

static void test_errors(void **state)
{
    (void)state;
    tsr_stop_matcher *m = (tsr_stop_matcher *)1;
    const char *empty[] = {"ok", ""};
    assert_int_equal(tsr_stop_matcher_new(empty, 2, &m), TSR_ERR_ARG);
    assert_null(m);
    const char *null_one[] = {NULL};
    assert_int_equal(tsr_stop_matcher_new(null_one, 1, &m), TSR_ERR_ARG);
    assert_int_equal(tsr_stop_matcher_new(NULL, 2, &m), TSR_ERR_ARG);
    assert_int_equal(tsr_stop_matcher_new(NULL, -1, &m), TSR_ERR_ARG);
    const char *ok[] = {"x"};
    assert_int_equal(tsr_stop_matcher_new(ok, 1, &m), TSR_OK);
    const char *out;
    size_t len;
    assert_int_equal(tsr_stop_push(m, NULL, 3, &out, &len, NULL), TSR_ERR_ARG);
    assert_int_equal(tsr_stop_push(m, NULL, 0, &out, &len, NULL), TSR_OK);
    assert_int_equal(len, 0);
    assert_int_equal(tsr_stop_push(m, "abc", 3, NULL, &len, NULL), TSR_ERR_ARG);
    assert_int_equal(tsr_stop_flush(NULL, &out, &len), TSR_ERR_ARG);
    assert_int_equal(tsr_stop_which(NULL), -1);
    tsr_stop_matcher_free(m);
    tsr_stop_matcher_free(NULL);
    /* a long text in one piece, the stop at its end */
    size_t n = 100000;
    char *big = malloc(n + 4);
    memset(big, 'a', n);
    memcpy(big + n, "STOP", 4);
    const char *stop[] = {"STOP"};
    assert_int_equal(tsr_stop_matcher_new(stop, 1, &m), TSR_OK);
    int matched;
    assert_int_equal(tsr_stop_push(m, big, n + 4, &out, &len, &matched), TSR_OK);
    assert_int_equal(len, n);
    assert_int_equal(matched, 1);
    tsr_stop_matcher_free(m);
    free(big);
}

/* ---- randomized: streaming equals the whole text at once ------------------------------------------------ */

static uint64_t rs = 42;
static uint32_t rnd(uint32_t n)
{
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rs >> 33) % n;
}

static void test_random_against_whole_text(void **state)
{
    (void)state;
    const char *alphabet[] = {"a", "b", "c", "é", "日", "🙂", " "};
    for (int iter = 0; iter < 3000; iter++) {
        char text[256] = "", stops_buf[4][32];
        const char *stops[4];
        int n_stops = 1 + (int)rnd(3);
        for (int s = 0; s < n_stops; s++) {
            stops_buf[s][0] = 0;
            int len = 1 + (int)rnd(3);
            for (int k = 0; k < len; k++) strcat(stops_buf[s], alphabet[rnd(iter % 2 ? 3 : 7)]);
            stops[s] = stops_buf[s];
        }
        int tl = (int)rnd(24);
        for (int k = 0; k < tl; k++) strcat(text, alphabet[rnd(iter % 2 ? 3 : 7)]);
        size_t tlen = strlen(text);
        /* reference: the occurrence that ends first, then the one that starts first, then the first listed */
        size_t best_end = SIZE_MAX, best_start = 0;
        int which = -1;
        for (int s = 0; s < n_stops; s++) {
            const char *at = strstr(text, stops[s]);
            if (!at) continue;
            size_t st = (size_t)(at - text), en = st + strlen(stops[s]);
            if (en < best_end || (en == best_end && st < best_start)) {
                best_end = en;
                best_start = st;
                which = s;
            }
        }
        size_t want_len = which >= 0 ? best_start : tlen;
        size_t cuts[8];
        int n_cuts = tlen ? (int)rnd(6) : 0;
        for (int c = 0; c < n_cuts; c++) cuts[c] = rnd((uint32_t)tlen + 1);
        for (int a = 1; a < n_cuts; a++) /* sort */
            for (int b = a; b > 0 && cuts[b - 1] > cuts[b]; b--) {
                size_t t = cuts[b];
                cuts[b] = cuts[b - 1];
                cuts[b - 1] = t;
            }
        streamed r = run(stops, n_stops, text, tlen, cuts, n_cuts, 1);
        if (r.len != want_len || memcmp(r.out, text, want_len) != 0 || r.which != which)
            fail_msg("iteration %d: text '%s', %d stops (first '%s'): released %zu bytes (stop %d), want %zu (stop %d)",
                     iter, text, n_stops, stops[0], r.len, r.which, want_len, which);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_everywhere), cmocka_unit_test(test_prefix_released),
        cmocka_unit_test(test_overlapping),      cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_errors),           cmocka_unit_test(test_random_against_whole_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
