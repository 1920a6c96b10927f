/* Small helpers of the tokenizer: growable byte and id buffers, UTF-8 decoding and validation, Rust-compatible
 * lossy UTF-8 conversion (one U+FFFD per maximal invalid subpart, like String::from_utf8_lossy), Unicode character
 * classes used by added-token matching, a string hash map (vocab) and a pair map (merge ranks), both open addressing
 * with linear probing, and the PCRE2 wrapper used by Split and Replace patterns. */
#include "runtime/text/tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

int tok_buf_reserve(tok_buf *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) return -1;
    b->data = p;
    b->cap = cap;
    return 0;
}

int tok_buf_add(tok_buf *b, const void *p, size_t n)
{
    if (tok_buf_reserve(b, n)) return -1;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
    return 0;
}

void tok_buf_free(tok_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

int tok_ids_push(tok_ids *a, int32_t id)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = id;
    return 0;
}

/* Checks the bytes of a multi-byte sequence starting with s[0]; returns the number of bytes that form a valid
 * prefix (k < need means invalid after k bytes, or incomplete when the input ended) and sets *need. */
static int utf8_prefix(const unsigned char *s, size_t n, int *need)
{
    unsigned c = s[0];
    unsigned lo = 0x80, hi = 0xBF;
    if (c < 0x80) {
        *need = 1;
        return 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
        *need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        *need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        *need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        *need = 1;
        return 0;
    }
    int k = 1;
    if ((size_t)k >= n) return k;
    if (s[1] < lo || s[1] > hi) return k;
    k = 2;
    while (k < *need && (size_t)k < n && s[k] >= 0x80 && s[k] <= 0xBF) k++;
    return k;
}

int tok_utf8_next(const unsigned char *s, size_t n, uint32_t *cp)
{
    if (!n) return 0;
    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    int need;
    int k = utf8_prefix(s, n, &need);
    if (k != need) return 0;
    uint32_t c;
    if (need == 2) c = ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    else if (need == 3) c = ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    else
        c = ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
            (s[3] & 0x3F);
    *cp = c;
    return need;
}

size_t tok_utf8_validate(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int k = tok_utf8_next(u + i, len - i, &cp);
        if (!k) return i;
        i += (size_t)k;
    }
    return len;
}

int tok_utf8_encode(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    } else if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    } else if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t tok_utf8_lossy(const unsigned char *s, size_t n, int final, tok_buf *out, int *err)
{
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    size_t i = 0, run = 0; /* run: start of the pending valid run */
    *err = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int need;
        int k = utf8_prefix(s + i, n - i, &need);
        if (k == need) {
            i += (size_t)k;
            continue;
        }
        if (i + (size_t)k == n && k > 0 && !final) break; /* incomplete tail: wait for more bytes */
        if (tok_buf_add(out, s + run, i - run) || tok_buf_add(out, fffd, 3)) {
            *err = 1;
            return 0;
        }
        i += (size_t)(k ? k : 1);
        run = i;
    }
    if (tok_buf_add(out, s + run, i - run)) *err = 1;
    return i;
}

int tok_is_whitespace(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

int tok_is_word_char(uint32_t c)
{
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (c == 0x200C || c == 0x200D) return 1;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
        return 1;
    default:
        return 0;
    }
}

uint64_t tok_hash(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 0x243F6A8885A308D3ull ^ (n * 0x9E3779B97F4A7C15ull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ v) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= (uint64_t)s[i] << (8 * i);
    h = (h ^ v) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    h *= 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 32);
}

static size_t table_size(size_t expected)
{
    size_t n = 16;
    while (n < expected * 2 + 2) n *= 2;
    return n;
}

int tok_strmap_init(tok_strmap *m, size_t expected)
{
    size_t n = table_size(expected);
    m->slots = calloc(n, sizeof *m->slots);
    if (!m->slots) return -1;
    m->mask = n - 1;
    m->count = 0;
    return 0;
}

static int strmap_grow(tok_strmap *m)
{
    tok_strmap bigger;
    if (tok_strmap_init(&bigger, m->count * 2 + 8)) return -1;
    for (size_t i = 0; i <= m->mask; i++)
        if (m->slots[i].key) tok_strmap_put(&bigger, m->slots[i].key, m->slots[i].len, m->slots[i].val);
    free(m->slots);
    *m = bigger;
    return 0;
}

int tok_strmap_put(tok_strmap *m, const char *key, size_t len, int32_t val)
{
    if ((m->count + 1) * 2 > m->mask + 1 && strmap_grow(m)) return -1;
    size_t i = (size_t)tok_hash(key, len) & m->mask;
    for (;;) {
        tok_strmap_slot *s = &m->slots[i];
        if (!s->key) {
            s->key = key;
            s->len = (uint32_t)len;
            s->val = val;
            m->count++;
            return 0;
        }
        if (s->len == len && !memcmp(s->key, key, len)) {
            s->val = val;
            return 0;
        }
        i = (i + 1) & m->mask;
    }
}

int32_t tok_strmap_get(const tok_strmap *m, const char *key, size_t len)
{
    if (!m->slots) return -1;
    size_t i = (size_t)tok_hash(key, len) & m->mask;
    for (;;) {
        const tok_strmap_slot *s = &m->slots[i];
        if (!s->key) return -1;
        if (s->len == len && !memcmp(s->key, key, len)) return s->val;
        i = (i + 1) & m->mask;
    }
}

void tok_strmap_free(tok_strmap *m)
{
    free(m->slots);
    m->slots = NULL;
}

int tok_pairmap_init(tok_pairmap *m, size_t expected)
{
    size_t n = table_size(expected);
    m->slots = malloc(n * sizeof *m->slots);
    if (!m->slots) return -1;
    for (size_t i = 0; i < n; i++) m->slots[i].key = UINT64_MAX;
    m->mask = n - 1;
    m->count = 0;
    return 0;
}

void tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    size_t i = (size_t)(h >> 20) & m->mask;
    for (;;) {
        tok_pairmap_slot *s = &m->slots[i];
        if (s->key == UINT64_MAX) {
            s->key = key;
            s->rank = rank;
            s->id = id;
            m->count++;
            return;
        }
        if (s->key == key) { /* a later duplicate merge wins, as in tokenizers */
            s->rank = rank;
            s->id = id;
            return;
        }
        i = (i + 1) & m->mask;
    }
}

void tok_pairmap_free(tok_pairmap *m)
{
    free(m->slots);
    m->slots = NULL;
}

/* PCRE2's caseless matching folds 's' with U+017F and 'k' with U+212A, Oniguruma (used by tokenizers) does not for
 * these patterns. Inside "(?i:" groups made only of literals, alternations and simple escapes, ASCII letters are
 * rewritten to [xX] and the group to "(?:". Other groups are left unchanged. */
static char *rewrite_caseless(const char *p, size_t n)
{
    tok_buf out = {0};
    size_t i = 0;
    while (i < n) {
        if (p[i] == '\\' && i + 1 < n) {
            if (tok_buf_add(&out, p + i, 2)) goto oom;
            i += 2;
            continue;
        }
        if (n - i >= 4 && !memcmp(p + i, "(?i:", 4)) {
            /* find the group's end; give up on nested groups or classes */
            size_t j = i + 4;
            int simple = 1;
            while (j < n && p[j] != ')') {
                if (p[j] == '(' || p[j] == '[') {
                    simple = 0;
                    break;
                }
                if (p[j] == '\\') {
                    if (j + 1 >= n || !strchr("'\"-.,:;!?#$%&*+/<=>@^_`{|}~ ", p[j + 1])) {
                        simple = 0;
                        break;
                    }
                    j++;
                }
                j++;
            }
            if (simple && j < n) {
                if (tok_buf_add(&out, "(?:", 3)) goto oom;
                for (size_t k = i + 4; k < j; k++) {
                    char c = p[k];
                    if (c == '\\') {
                        if (tok_buf_add(&out, p + k, 2)) goto oom;
                        k++;
                    } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
                        char cls[4] = {'[', (char)(c | 0x20), (char)(c & ~0x20), ']'};
                        if (tok_buf_add(&out, cls, 4)) goto oom;
                    } else if (tok_buf_add(&out, &c, 1)) {
                        goto oom;
                    }
                }
                if (tok_buf_add(&out, ")", 1)) goto oom;
                i = j + 1;
                continue;
            }
        }
        if (tok_buf_add(&out, p + i, 1)) goto oom;
        i++;
    }
    if (tok_buf_add(&out, "", 0)) goto oom;
    return out.data;
oom:
    tok_buf_free(&out);
    return NULL;
}

tsr_status tok_regex_compile(tok_regex *re, const char *pattern, size_t len, const char *where)
{
    char *pat = rewrite_caseless(pattern, len);
    if (!pat) return tsr_fail(TSR_ERR_NOMEM, "%s: out of memory", where);
    int errcode;
    PCRE2_SIZE erroff;
    re->code = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &errcode, &erroff, NULL);
    free(pat);
    if (!re->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(errcode, msg, sizeof msg);
        return tsr_fail(TSR_ERR_UNSUPPORTED, "%s: regex /%.*s/ not supported by PCRE2: %s (at offset %zu)", where,
                        (int)(len > 200 ? 200 : len), pattern, (const char *)msg, (size_t)erroff);
    }
    re->jit = pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0;
    return TSR_OK;
}

void tok_regex_free(tok_regex *re)
{
    if (re->code) pcre2_code_free(re->code);
    re->code = NULL;
}

void tok_pattern_free(tok_pattern *p)
{
    free(p->lit);
    p->lit = NULL;
    tok_regex_free(&p->re);
}

int tok_regex_find(const tok_regex *re, pcre2_match_data *md, pcre2_match_context *mc, const char *s, size_t n,
                   size_t from, size_t *ms, size_t *me)
{
    int rc = re->jit ? pcre2_jit_match(re->code, (PCRE2_SPTR)s, n, from, 0, md, mc)
                     : pcre2_match(re->code, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, md, mc);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) return -1;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}
