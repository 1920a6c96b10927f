/* Filters, tests, methods of str/dict/list and their argument handling (see jinja_filters.h).
 *
 * Each filter binds its positional and keyword arguments against the Jinja2 signature (bind_args), then
 * reproduces the Jinja2 3.1 / CPython result. Case mapping uses utf8proc's simple per-code-point mappings;
 * whitespace is CPython's str.isspace() set. Mutating list/dict methods fail as in transformers'
 * ImmutableSandboxedEnvironment. */
#include "runtime/text/jinja_filters.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- tables ---- */

static const char *const filters_ok[] = {
    "abs", "attr", "capitalize", "count", "d", "default", "dictsort", "e", "escape", "first", "float", "forceescape",
    "indent", "int", "items", "join", "last", "length", "list", "lower", "map", "max", "min", "reject",
    "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr", "sort", "string", "sum", "title",
    "tojson", "trim", "unique", "upper", "wordcount", NULL};
static const char *const filters_jinja[] = {"batch", "center", "filesizeformat", "format", "groupby", "pprint",
                                            "random", "slice", "striptags", "truncate", "urlencode", "urlize",
                                            "wordwrap", "xmlattr", NULL};
static const char *const tests_ok[] = {
    "defined", "undefined", "none", "string", "number", "integer", "float", "boolean", "mapping", "iterable",
    "sequence", "true", "false", "equalto", "eq", "==", "ne", "!=", "lt", "<", "le", "<=", "gt", ">", "ge", ">=",
    "lessthan", "greaterthan", "odd", "even", "in", "divisibleby", "lower", "upper", "callable", "sameas", "escaped",
    NULL};
static const char *const tests_jinja[] = {"filter", "test", NULL};

static int in_list(const char *const *l, const char *name)
{
    for (int i = 0; l[i]; i++)
        if (!strcmp(l[i], name)) return 1;
    return 0;
}

int jinja_filter_known(const char *name)
{
    if (in_list(filters_ok, name)) return 1;
    return in_list(filters_jinja, name) ? -1 : 0;
}

int jinja_test_known(const char *name)
{
    if (in_list(tests_ok, name)) return 1;
    return in_list(tests_jinja, name) ? -1 : 0;
}

/* ---- argument binding ---- */

/* Binds args/kwargs to the parameter names (NULL-terminated); out[i] is undefined when not given. */
static void bind_args(jctx *c, const char *fname, const char *const *params, jv *out, jv *args, size_t nargs,
                      const char **kwn, jv *kwv, size_t nkw, int line)
{
    size_t np = 0;
    while (params[np]) np++;
    if (nargs > np)
        jinja_raise(c->err, TSR_ERR_FORMAT, line, "%s() takes at most %zu argument(s), %zu given", fname, np, nargs);
    for (size_t i = 0; i < np; i++) out[i] = i < nargs ? args[i] : jv_undef();
    for (size_t k = 0; k < nkw; k++) {
        size_t i;
        for (i = 0; i < np; i++)
            if (!strcmp(params[i], kwn[k])) break;
        if (i == np)
            jinja_raise(c->err, TSR_ERR_FORMAT, line, "%s() got an unexpected keyword argument '%s'", fname, kwn[k]);
        out[i] = kwv[k];
    }
}

static jv str_of(jctx *c, jv v) { return jinja_str(c, v); }

static int64_t want_int(jctx *c, jv v, const char *what, int line)
{
    if (v.t == JV_INT || v.t == JV_BOOL) return v.u.i;
    jinja_raise(c->err, TSR_ERR_FORMAT, line, "%s must be an integer, not '%s'", what, jv_type_name(v));
}

static jv want_str(jctx *c, jv v, const char *what, int line)
{
    if (v.t == JV_STR) return v;
    if (v.t == JV_UNDEF) jinja_undefined_error(c, v, line);
    jinja_raise(c->err, TSR_ERR_FORMAT, line, "%s must be a string, not '%s'", what, jv_type_name(v));
}

static jv empty_str(void) { return jv_str("", 0); }
static jv buf_val(jbuf *b) { return b->p ? jbuf_value(b) : empty_str(); }

/* ---- string helpers ---- */

typedef enum { CASE_UPPER, CASE_LOWER } case_kind;

static void put_cp(jbuf *b, uint32_t cp)
{
    char tmp[4];
    jbuf_put(b, tmp, utf8_put(tmp, cp));
}

static uint32_t map_case(uint32_t cp, case_kind k)
{
    if (cp > 0x10ffff) return cp;
    return (uint32_t)(k == CASE_UPPER ? utf8proc_toupper((utf8proc_int32_t)cp)
                                      : utf8proc_tolower((utf8proc_int32_t)cp));
}

static int is_cased(uint32_t cp)
{
    if (cp > 0x10ffff) return 0;
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
    return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

/* The one-to-many mappings of Unicode SpecialCasing that CPython applies and utf8proc does not. */
static int special_case(jbuf *b, uint32_t cp, case_kind k)
{
    static const struct {
        uint32_t cp;
        const char *upper;
    } up[] = {{0xdf, "SS"}, {0xfb00, "FF"}, {0xfb01, "FI"}, {0xfb02, "FL"}, {0xfb03, "FFI"}, {0xfb04, "FFL"},
              {0xfb05, "ST"}, {0xfb06, "ST"}, {0x149, "\xca\xbcN"}};
    if (k == CASE_UPPER) {
        for (size_t i = 0; i < sizeof up / sizeof up[0]; i++)
            if (up[i].cp == cp) {
                jbuf_puts(b, up[i].upper);
                return 1;
            }
        return 0;
    }
    if (cp == 0x130) { /* İ -> i + combining dot above */
        jbuf_puts(b, "i\xcc\x87");
        return 1;
    }
    return 0;
}

static jv str_case(jctx *c, jv s, case_kind k)
{
    jbuf b = {.a = c->a};
    for (size_t i = 0; i < s.u.s.n;) {
        uint32_t cp;
        size_t nx = utf8_next(s.u.s.p, s.u.s.n, i, &cp);
        if (!special_case(&b, cp, k)) put_cp(&b, map_case(cp, k));
        i = nx;
    }
    return buf_val(&b);
}

/* first upper, rest lower */
static jv str_capitalize(jctx *c, jv s)
{
    jbuf b = {.a = c->a};
    int first = 1;
    for (size_t i = 0; i < s.u.s.n;) {
        uint32_t cp;
        size_t nx = utf8_next(s.u.s.p, s.u.s.n, i, &cp);
        put_cp(&b, map_case(cp, first ? CASE_UPPER : CASE_LOWER));
        first = 0;
        i = nx;
    }
    return buf_val(&b);
}

/* Python str.title() */
static jv str_title_py(jctx *c, jv s)
{
    jbuf b = {.a = c->a};
    int prev = 0;
    for (size_t i = 0; i < s.u.s.n;) {
        uint32_t cp;
        size_t nx = utf8_next(s.u.s.p, s.u.s.n, i, &cp);
        if (is_cased(cp)) {
            put_cp(&b, map_case(cp, prev ? CASE_LOWER : CASE_UPPER));
            prev = 1;
        } else {
            put_cp(&b, cp);
            prev = 0;
        }
        i = nx;
    }
    return buf_val(&b);
}

/* Jinja's title filter: words begin after runs of [-\s({\[<] */
static jv str_title_jinja(jctx *c, jv s)
{
    jbuf b = {.a = c->a};
    int at_start = 1;
    for (size_t i = 0; i < s.u.s.n;) {
        uint32_t cp;
        size_t nx = utf8_next(s.u.s.p, s.u.s.n, i, &cp);
        int sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || py_isspace(cp);
        if (sep) {
            put_cp(&b, cp);
            at_start = 1;
        } else {
            put_cp(&b, map_case(cp, at_start ? CASE_UPPER : CASE_LOWER));
            at_start = 0;
        }
        i = nx;
    }
    return buf_val(&b);
}

static int cp_in(uint32_t cp, jv chars)
{
    for (size_t i = 0; i < chars.u.s.n;) {
        uint32_t x;
        i = utf8_next(chars.u.s.p, chars.u.s.n, i, &x);
        if (x == cp) return 1;
    }
    return 0;
}

/* which: 1 left, 2 right, 3 both. chars undefined/none: whitespace. */
static jv str_strip(jctx *c, jv s, jv chars, int which, int line)
{
    int ws = chars.t == JV_UNDEF || chars.t == JV_NONE;
    if (!ws) chars = want_str(c, chars, "strip argument", line);
    size_t a = 0, b = s.u.s.n;
    if (which & 1)
        while (a < b) {
            uint32_t cp;
            size_t nx = utf8_next(s.u.s.p, s.u.s.n, a, &cp);
            if (ws ? !py_isspace(cp) : !cp_in(cp, chars)) break;
            a = nx;
        }
    if (which & 2)
        while (b > a) {
            size_t st = b - 1;
            while (st > a && ((unsigned char)s.u.s.p[st] & 0xc0) == 0x80) st--;
            uint32_t cp;
            size_t nx = utf8_next(s.u.s.p, s.u.s.n, st, &cp);
            if (nx != b) { /* invalid sequence: treat the last byte alone */
                st = b - 1;
                cp = (unsigned char)s.u.s.p[st];
            }
            if (ws ? !py_isspace(cp) : !cp_in(cp, chars)) break;
            b = st;
        }
    return jv_str(s.u.s.p + a, b - a);
}

static const char *find_bytes(const char *h, size_t hn, const char *n, size_t nn)
{
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    return memmem(h, hn, n, nn);
}

static jv str_replace(jctx *c, jv s, jv old, jv rep, int64_t count)
{
    jbuf b = {.a = c->a};
    if (old.u.s.n == 0) { /* Python inserts rep around every code point */
        int64_t done = 0;
        size_t i = 0;
        while (i <= s.u.s.n) {
            if (count < 0 || done < count) {
                jbuf_put(&b, rep.u.s.p, rep.u.s.n);
                done++;
            }
            if (i == s.u.s.n) break;
            uint32_t cp;
            size_t nx = utf8_next(s.u.s.p, s.u.s.n, i, &cp);
            jbuf_put(&b, s.u.s.p + i, nx - i);
            i = nx;
        }
        return buf_val(&b);
    }
    size_t i = 0;
    int64_t done = 0;
    while (i <= s.u.s.n) {
        const char *f = (count < 0 || done < count) ? find_bytes(s.u.s.p + i, s.u.s.n - i, old.u.s.p, old.u.s.n) : NULL;
        if (!f) {
            jbuf_put(&b, s.u.s.p + i, s.u.s.n - i);
            break;
        }
        size_t at = (size_t)(f - s.u.s.p);
        jbuf_put(&b, s.u.s.p + i, at - i);
        jbuf_put(&b, rep.u.s.p, rep.u.s.n);
        i = at + old.u.s.n;
        done++;
    }
    return buf_val(&b);
}

static jv str_split(jctx *c, jv s, jv sep, int64_t maxsplit, int right, int line)
{
    jv out = jv_list_new(c->a, 0);
    if (sep.t == JV_UNDEF || sep.t == JV_NONE) {
        /* whitespace split: collect words, then honour maxsplit from the proper side */
        size_t *st = NULL, *en = NULL, nw = 0, cap = 0;
        size_t i = 0;
        while (i < s.u.s.n) {
            uint32_t cp;
            size_t nx = utf8_next(s.u.s.p, s.u.s.n, i, &cp);
            if (py_isspace(cp)) {
                i = nx;
                continue;
            }
            size_t start = i;
            while (i < s.u.s.n) {
                nx = utf8_next(s.u.s.p, s.u.s.n, i, &cp);
                if (py_isspace(cp)) break;
                i = nx;
            }
            if (nw == cap) {
                size_t ncap = cap ? cap * 2 : 8;
                size_t *a1 = ja_alloc(c->a, ncap * sizeof *a1), *a2 = ja_alloc(c->a, ncap * sizeof *a2);
                if (nw) {
                    memcpy(a1, st, nw * sizeof *a1);
                    memcpy(a2, en, nw * sizeof *a2);
                }
                st = a1;
                en = a2;
                cap = ncap;
            }
            st[nw] = start;
            en[nw] = i;
            nw++;
        }
        if (maxsplit < 0 || (size_t)maxsplit + 1 >= nw) {
            for (size_t k = 0; k < nw; k++) jv_list_push(c->a, out, jv_str(s.u.s.p + st[k], en[k] - st[k]));
        } else if (!right) {
            for (size_t k = 0; k < (size_t)maxsplit; k++)
                jv_list_push(c->a, out, jv_str(s.u.s.p + st[k], en[k] - st[k]));
            jv rest = str_strip(c, jv_str(s.u.s.p + st[maxsplit], s.u.s.n - st[maxsplit]), jv_undef(), 2, line);
            jv_list_push(c->a, out, rest);
        } else {
            size_t first = nw - (size_t)maxsplit;
            jv rest = str_strip(c, jv_str(s.u.s.p, en[first - 1]), jv_undef(), 1, line);
            jv_list_push(c->a, out, rest);
            for (size_t k = first; k < nw; k++) jv_list_push(c->a, out, jv_str(s.u.s.p + st[k], en[k] - st[k]));
        }
        return out;
    }
    sep = want_str(c, sep, "separator", line);
    if (sep.u.s.n == 0) jinja_raise(c->err, TSR_ERR_FORMAT, line, "empty separator");
    if (!right || maxsplit < 0) {
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            const char *f =
                (maxsplit < 0 || done < maxsplit) ? find_bytes(s.u.s.p + i, s.u.s.n - i, sep.u.s.p, sep.u.s.n) : NULL;
            if (!f) {
                jv_list_push(c->a, out, jv_str(s.u.s.p + i, s.u.s.n - i));
                break;
            }
            size_t at = (size_t)(f - s.u.s.p);
            jv_list_push(c->a, out, jv_str(s.u.s.p + i, at - i));
            i = at + sep.u.s.n;
            done++;
        }
        return out;
    }
    /* rsplit with maxsplit: split from the right */
    size_t end = s.u.s.n;
    int64_t done = 0;
    jv rev = jv_list_new(c->a, 0);
    while (done < maxsplit) {
        const char *found = NULL;
        if (end >= sep.u.s.n)
            for (size_t k = end - sep.u.s.n + 1; k-- > 0;)
                if (!memcmp(s.u.s.p + k, sep.u.s.p, sep.u.s.n)) {
                    found = s.u.s.p + k;
                    break;
                }
        if (!found) break;
        size_t at = (size_t)(found - s.u.s.p);
        jv_list_push(c->a, rev, jv_str(s.u.s.p + at + sep.u.s.n, end - at - sep.u.s.n));
        end = at;
        done++;
    }
    jv_list_push(c->a, out, jv_str(s.u.s.p, end));
    for (size_t k = rev.u.l->n; k-- > 0;) jv_list_push(c->a, out, rev.u.l->v[k]);
    return out;
}

static size_t cp_index(jv s, size_t byte_off) { return utf8_len(s.u.s.p, byte_off); }

static jv html_escape(jctx *c, jv s)
{
    jbuf b = {.a = c->a};
    for (size_t i = 0; i < s.u.s.n; i++) {
        char ch = s.u.s.p[i];
        switch (ch) {
        case '&': jbuf_puts(&b, "&amp;"); break;
        case '<': jbuf_puts(&b, "&lt;"); break;
        case '>': jbuf_puts(&b, "&gt;"); break;
        case '"': jbuf_puts(&b, "&#34;"); break;
        case '\'': jbuf_puts(&b, "&#39;"); break;
        default: jbuf_putc(&b, ch);
        }
    }
    return buf_val(&b);
}

/* Python int(str): optional sign, digits with single underscores, surrounding whitespace. */
static int parse_int_str(jv s, int64_t *out)
{
    jv t = s;
    size_t a = 0, b = t.u.s.n;
    while (a < b && (t.u.s.p[a] == ' ' || (t.u.s.p[a] >= 9 && t.u.s.p[a] <= 13))) a++;
    while (b > a && (t.u.s.p[b - 1] == ' ' || (t.u.s.p[b - 1] >= 9 && t.u.s.p[b - 1] <= 13))) b--;
    if (a == b) return 0;
    int neg = 0;
    if (t.u.s.p[a] == '+' || t.u.s.p[a] == '-') neg = t.u.s.p[a++] == '-';
    if (a == b) return 0;
    int64_t v = 0;
    int prev_digit = 0;
    for (size_t i = a; i < b; i++) {
        char ch = t.u.s.p[i];
        if (ch == '_' && prev_digit && i + 1 < b) {
            prev_digit = 0;
            continue;
        }
        if (ch < '0' || ch > '9') return 0;
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, ch - '0', &v)) return 0;
        prev_digit = 1;
    }
    if (!prev_digit) return 0;
    *out = neg ? -v : v;
    return 1;
}

static int parse_float_str(jctx *c, jv s, double *out)
{
    char *z = ja_strdup(c->a, s.u.s.p, s.u.s.n);
    char *p = z;
    while (*p == ' ' || (*p >= 9 && *p <= 13)) p++;
    if (!*p) return 0;
    char *end;
    double v = strtod(p, &end);
    if (end == p) return 0;
    while (*end == ' ' || (*end >= 9 && *end <= 13)) end++;
    if (*end) return 0;
    if (strchr(p, 'x') || strchr(p, 'X')) return 0; /* hex floats are not Python floats */
    *out = v;
    return 1;
}

/* ---- attribute paths (map/selectattr/sort attribute=) ---- */

static jv attr_path(jctx *c, jv item, jv path, int line)
{
    path = want_str(c, path, "attribute", line);
    size_t i = 0;
    jv v = item;
    while (i <= path.u.s.n) {
        const char *dot = memchr(path.u.s.p + i, '.', path.u.s.n - i);
        size_t e = dot ? (size_t)(dot - path.u.s.p) : path.u.s.n;
        jv part = jv_str(path.u.s.p + i, e - i);
        int64_t idx;
        if (parse_int_str(part, &idx) && part.u.s.n && part.u.s.p[0] >= '0' && part.u.s.p[0] <= '9') part = jv_int(idx);
        if (v.t == JV_UNDEF) return v;
        v = jinja_getitem(c, v, part, line);
        if (!dot) break;
        i = e + 1;
    }
    return v;
}

/* ---- sorting ---- */

typedef struct {
    jv key;
    jv item;
    size_t idx;
} sort_entry;

/* Stable merge sort in the arena (qsort could leak its buffer when a comparison raises). */
static int entry_cmp(jctx *c, const sort_entry *a, const sort_entry *b, int reverse, int line)
{
    int r = jinja_compare(c, a->key, b->key, line);
    return reverse ? -r : r;
}

static void merge_sort(jctx *c, sort_entry *e, size_t n, int reverse, int line)
{
    sort_entry *tmp = ja_alloc(c->a, (n + 1) * sizeof *tmp);
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) tmp[k++] = entry_cmp(c, &e[j], &e[i], reverse, line) < 0 ? e[j++] : e[i++];
            while (i < mid) tmp[k++] = e[i++];
            while (j < hi) tmp[k++] = e[j++];
        }
        memcpy(e, tmp, n * sizeof *e);
    }
}

static jv fold_key(jctx *c, jv v, int case_sensitive)
{
    if (!case_sensitive && v.t == JV_STR) return str_case(c, v, CASE_LOWER);
    return v;
}

static jv sorted(jctx *c, jv list, int reverse, int case_sensitive, jv attribute, int by_value, int line)
{
    size_t n = list.u.l->n;
    sort_entry *e = ja_alloc(c->a, (n + 1) * sizeof *e);
    for (size_t i = 0; i < n; i++) {
        jv it = list.u.l->v[i];
        jv k = it;
        if (by_value >= 0) k = it.u.l->v[by_value];
        if (attribute.t != JV_UNDEF && attribute.t != JV_NONE) k = attr_path(c, it, attribute, line);
        e[i].key = fold_key(c, k, case_sensitive);
        e[i].item = it;
        e[i].idx = i;
    }
    merge_sort(c, e, n, reverse, line);
    jv out = jv_list_new(c->a, n);
    for (size_t i = 0; i < n; i++) out.u.l->v[out.u.l->n++] = e[i].item;
    return out;
}

static int is_true_default(jv v, int dflt) { return v.t == JV_UNDEF ? dflt : jv_truthy(v); }

/* ---- tests ---- */

int jinja_apply_test(jctx *c, const char *name, jv v, jv *args, size_t nargs, int line)
{
#define NEED_ARG()                                                                                                 \
    do {                                                                                                           \
        if (nargs < 1) jinja_raise(c->err, TSR_ERR_FORMAT, line, "test '%s' needs an argument", name);             \
    } while (0)
    if (!strcmp(name, "defined")) return v.t != JV_UNDEF;
    if (!strcmp(name, "undefined")) return v.t == JV_UNDEF;
    if (!strcmp(name, "none")) return v.t == JV_NONE;
    if (!strcmp(name, "string")) return v.t == JV_STR;
    if (!strcmp(name, "number")) return jv_is_number(v);
    if (!strcmp(name, "integer")) return v.t == JV_INT;
    if (!strcmp(name, "float")) return v.t == JV_FLOAT;
    if (!strcmp(name, "boolean")) return v.t == JV_BOOL;
    if (!strcmp(name, "mapping")) return v.t == JV_DICT;
    if (!strcmp(name, "iterable") || !strcmp(name, "sequence"))
        return v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF;
    if (!strcmp(name, "true")) return v.t == JV_BOOL && v.u.i;
    if (!strcmp(name, "false")) return v.t == JV_BOOL && !v.u.i;
    if (!strcmp(name, "callable")) return v.t == JV_MACRO || v.t == JV_FUNC;
    if (!strcmp(name, "escaped")) return 0;
    if (!strcmp(name, "equalto") || !strcmp(name, "eq") || !strcmp(name, "==")) {
        NEED_ARG();
        return jv_equal(v, args[0]);
    }
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) {
        NEED_ARG();
        return !jv_equal(v, args[0]);
    }
    if (!strcmp(name, "sameas")) {
        NEED_ARG();
        if (v.t != args[0].t) return 0;
        if (v.t == JV_LIST || v.t == JV_DICT || v.t == JV_NS) return v.u.ptr == args[0].u.ptr;
        return jv_equal(v, args[0]);
    }
    if (!strcmp(name, "lt") || !strcmp(name, "<") || !strcmp(name, "lessthan")) {
        NEED_ARG();
        return jinja_compare(c, v, args[0], line) < 0;
    }
    if (!strcmp(name, "le") || !strcmp(name, "<=")) {
        NEED_ARG();
        return jinja_compare(c, v, args[0], line) <= 0;
    }
    if (!strcmp(name, "gt") || !strcmp(name, ">") || !strcmp(name, "greaterthan")) {
        NEED_ARG();
        return jinja_compare(c, v, args[0], line) > 0;
    }
    if (!strcmp(name, "ge") || !strcmp(name, ">=")) {
        NEED_ARG();
        return jinja_compare(c, v, args[0], line) >= 0;
    }
    if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        if (v.t == JV_UNDEF) jinja_undefined_error(c, v, line);
        int64_t d = 2;
        if (!strcmp(name, "divisibleby")) {
            NEED_ARG();
            d = want_int(c, args[0], "divisibleby argument", line);
            if (d == 0) jinja_raise(c->err, TSR_ERR_FORMAT, line, "integer division or modulo by zero");
        }
        int64_t x = want_int(c, v, "value", line);
        int64_t m = x % d;
        if (!strcmp(name, "odd")) return m != 0;
        return m == 0;
    }
    if (!strcmp(name, "in")) {
        NEED_ARG();
        jv hay = args[0];
        if (hay.t == JV_STR) {
            jv nd = want_str(c, v, "left operand of 'in <string>'", line);
            return find_bytes(hay.u.s.p, hay.u.s.n, nd.u.s.p, nd.u.s.n) != NULL;
        }
        if (hay.t == JV_LIST) {
            for (size_t i = 0; i < hay.u.l->n; i++)
                if (jv_equal(hay.u.l->v[i], v)) return 1;
            return 0;
        }
        if (hay.t == JV_DICT) return jv_dict_find_v(hay, v) != NULL;
        if (hay.t == JV_UNDEF) return 0;
        jinja_raise(c->err, TSR_ERR_FORMAT, line, "argument of type '%s' is not iterable", jv_type_name(hay));
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        jv s = str_of(c, v);
        int any = 0;
        case_kind k = !strcmp(name, "lower") ? CASE_LOWER : CASE_UPPER;
        for (size_t i = 0; i < s.u.s.n;) {
            uint32_t cp;
            i = utf8_next(s.u.s.p, s.u.s.n, i, &cp);
            if (is_cased(cp)) {
                any = 1;
                if (map_case(cp, k) != cp) return 0;
            }
        }
        return any;
    }
    jinja_raise(c->err, TSR_ERR_UNSUPPORTED, line, "unsupported construct: test '%s'", name);
#undef NEED_ARG
}

/* ---- filters ---- */

static jv tojson(jctx *c, jv v, jv *a, int line)
{
    /* transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
    int ascii = is_true_default(a[0], 0);
    const char *indent = NULL;
    if (a[1].t == JV_INT || a[1].t == JV_BOOL) {
        int64_t n = a[1].u.i;
        if (n < 0) n = 0;
        if (n > 64) jinja_raise(c->err, TSR_ERR_UNSUPPORTED, line, "tojson indent over 64 is not supported");
        char *s = ja_alloc(c->a, (size_t)n + 1);
        memset(s, ' ', (size_t)n);
        indent = s;
    } else if (a[1].t == JV_STR)
        indent = ja_strdup(c->a, a[1].u.s.p, a[1].u.s.n);
    else if (a[1].t != JV_UNDEF && a[1].t != JV_NONE)
        jinja_raise(c->err, TSR_ERR_FORMAT, line, "tojson: indent must be an integer or a string");
    const char *item_sep = indent ? "," : ", ", *key_sep = ": ";
    if (a[2].t == JV_LIST && a[2].u.l->n == 2 && a[2].u.l->v[0].t == JV_STR && a[2].u.l->v[1].t == JV_STR) {
        item_sep = ja_strdup(c->a, a[2].u.l->v[0].u.s.p, a[2].u.l->v[0].u.s.n);
        key_sep = ja_strdup(c->a, a[2].u.l->v[1].u.s.p, a[2].u.l->v[1].u.s.n);
    } else if (a[2].t != JV_UNDEF && a[2].t != JV_NONE)
        jinja_raise(c->err, TSR_ERR_FORMAT, line, "tojson: separators must be a pair of strings");
    jbuf b = {.a = c->a};
    jv_to_json(&b, v, indent, item_sep, key_sep, is_true_default(a[3], 0), ascii, c->err, line);
    return buf_val(&b);
}

static jv do_indent(jctx *c, jv s, jv *a, int line)
{
    jv ind;
    if (a[0].t == JV_STR)
        ind = a[0];
    else {
        int64_t w = a[0].t == JV_UNDEF ? 4 : want_int(c, a[0], "indent width", line);
        if (w < 0) w = 0;
        if (w > 1024) jinja_raise(c->err, TSR_ERR_UNSUPPORTED, line, "indent width over 1024 is not supported");
        char *p = ja_alloc(c->a, (size_t)w + 1);
        memset(p, ' ', (size_t)w);
        ind = jv_str(p, (size_t)w);
    }
    int first = is_true_default(a[1], 0), blank = is_true_default(a[2], 0);
    /* Jinja: s += "\n"; lines = s.splitlines(); line breaks as in Python's str.splitlines */
    jbuf t = {.a = c->a};
    jbuf_put(&t, s.u.s.p, s.u.s.n);
    jbuf_putc(&t, '\n');
    const char *p = t.p;
    size_t n = t.n, i = 0;
    jbuf b = {.a = c->a};
    if (first) jbuf_put(&b, ind.u.s.p, ind.u.s.n);
    int lineno = 0;
    while (i < n) {
        size_t e = i, term = 0;
        while (e < n) {
            unsigned char ch = (unsigned char)p[e];
            if (ch == '\r') {
                term = (e + 1 < n && p[e + 1] == '\n') ? 2 : 1;
                break;
            }
            if (ch == '\n' || ch == '\v' || ch == '\f' || (ch >= 0x1c && ch <= 0x1e)) {
                term = 1;
                break;
            }
            if (ch == 0xc2 && e + 1 < n && (unsigned char)p[e + 1] == 0x85) {
                term = 2;
                break;
            }
            if (ch == 0xe2 && e + 2 < n && (unsigned char)p[e + 1] == 0x80 &&
                ((unsigned char)p[e + 2] == 0xa8 || (unsigned char)p[e + 2] == 0xa9)) {
                term = 3;
                break;
            }
            e++;
        }
        if (lineno > 0) {
            jbuf_putc(&b, '\n');
            if (blank || e > i) jbuf_put(&b, ind.u.s.p, ind.u.s.n);
        }
        jbuf_put(&b, p + i, e - i);
        lineno++;
        i = e + term;
    }
    return buf_val(&b);
}

static jv map_or_select(jctx *c, const char *fname, jv v, jv *args, size_t nargs, const char **kwn, jv *kwv,
                        size_t nkw, int line)
{
    jv items = jinja_to_list(c, v, line);
    jv out = jv_list_new(c->a, 0);
    if (!strcmp(fname, "map")) {
        jv attribute = jv_undef(), dflt = jv_undef();
        for (size_t k = 0; k < nkw; k++) {
            if (!strcmp(kwn[k], "attribute"))
                attribute = kwv[k];
            else if (!strcmp(kwn[k], "default"))
                dflt = kwv[k];
            else if (nargs == 0)
                jinja_raise(c->err, TSR_ERR_FORMAT, line, "map() got an unexpected keyword argument '%s'", kwn[k]);
        }
        if (attribute.t != JV_UNDEF) {
            for (size_t i = 0; i < items.u.l->n; i++) {
                jv r = attr_path(c, items.u.l->v[i], attribute, line);
                if (r.t == JV_UNDEF && dflt.t != JV_UNDEF) r = dflt;
                jv_list_push(c->a, out, r);
            }
            return out;
        }
        if (nargs < 1) jinja_raise(c->err, TSR_ERR_FORMAT, line, "map() needs a filter name or attribute=");
        jv fname2 = want_str(c, args[0], "map filter name", line);
        char *fn = ja_strdup(c->a, fname2.u.s.p, fname2.u.s.n);
        int known = jinja_filter_known(fn);
        if (known <= 0)
            jinja_raise(c->err, known < 0 ? TSR_ERR_UNSUPPORTED : TSR_ERR_FORMAT, line, "%s filter '%s' in map()",
                        known < 0 ? "unsupported" : "no", fn);
        for (size_t i = 0; i < items.u.l->n; i++)
            jv_list_push(c->a, out,
                         jinja_apply_filter(c, fn, items.u.l->v[i], args + 1, nargs - 1, kwn, kwv, nkw, line));
        return out;
    }
    int is_attr = !strcmp(fname, "selectattr") || !strcmp(fname, "rejectattr");
    int want = !strcmp(fname, "select") || !strcmp(fname, "selectattr");
    if (nkw) jinja_raise(c->err, TSR_ERR_FORMAT, line, "%s() takes no keyword arguments", fname);
    size_t ai = 0;
    jv attribute = jv_undef();
    if (is_attr) {
        if (nargs < 1) jinja_raise(c->err, TSR_ERR_FORMAT, line, "%s() needs an attribute name", fname);
        attribute = args[ai++];
    }
    char *test = NULL;
    if (ai < nargs) {
        jv t = want_str(c, args[ai++], "test name", line);
        test = ja_strdup(c->a, t.u.s.p, t.u.s.n);
        int known = jinja_test_known(test);
        if (known <= 0)
            jinja_raise(c->err, known < 0 ? TSR_ERR_UNSUPPORTED : TSR_ERR_FORMAT, line, "%s test '%s' in %s()",
                        known < 0 ? "unsupported" : "no", test, fname);
    }
    for (size_t i = 0; i < items.u.l->n; i++) {
        jv it = items.u.l->v[i];
        jv val = is_attr ? attr_path(c, it, attribute, line) : it;
        int r = test ? jinja_apply_test(c, test, val, args + ai, nargs - ai, line) : jv_truthy(val);
        if (r == want) jv_list_push(c->a, out, it);
    }
    return out;
}

static jv do_unique(jctx *c, jv v, jv *a, int line)
{
    jv items = jinja_to_list(c, v, line);
    int cs = is_true_default(a[0], 0);
    jv seen = jv_list_new(c->a, 0), out = jv_list_new(c->a, 0);
    for (size_t i = 0; i < items.u.l->n; i++) {
        jv it = items.u.l->v[i];
        jv k = a[1].t != JV_UNDEF && a[1].t != JV_NONE ? attr_path(c, it, a[1], line) : it;
        k = fold_key(c, k, cs);
        int dup = 0;
        for (size_t j = 0; j < seen.u.l->n && !dup; j++) dup = jv_equal(seen.u.l->v[j], k);
        if (dup) continue;
        jv_list_push(c->a, seen, k);
        jv_list_push(c->a, out, it);
    }
    return out;
}

static jv minmax(jctx *c, jv v, jv *a, int want_max, int line)
{
    jv items = jinja_to_list(c, v, line);
    if (!items.u.l->n) return jv_undef();
    int cs = is_true_default(a[0], 0);
    jv best = items.u.l->v[0], bestk = jv_undef();
    for (size_t i = 0; i < items.u.l->n; i++) {
        jv it = items.u.l->v[i];
        jv k = a[1].t != JV_UNDEF && a[1].t != JV_NONE ? attr_path(c, it, a[1], line) : it;
        k = fold_key(c, k, cs);
        if (i == 0 || (want_max ? jinja_compare(c, k, bestk, line) > 0 : jinja_compare(c, k, bestk, line) < 0)) {
            best = it;
            bestk = k;
        }
    }
    return best;
}

static double py_round(double x, int64_t nd)
{
    if (nd == 0) return nearbyint(x);
    if (nd > 22 || nd < -22) return x;
    double p = pow(10.0, (double)(nd < 0 ? -nd : nd));
    double y = nd > 0 ? x * p : x / p;
    double r = nearbyint(y);
    if (fabs(y - r) == 0.5) r = 2.0 * nearbyint(y / 2.0);
    return nd > 0 ? r / p : r * p;
}

jv jinja_apply_filter(jctx *c, const char *name, jv v, jv *args, size_t nargs, const char **kwn, jv *kwv,
                      size_t nkw, int line)
{
    jv a[6];
#define BIND(...)                                                                                                   \
    do {                                                                                                            \
        static const char *const params_[] = {__VA_ARGS__, NULL};                                                   \
        bind_args(c, name, params_, a, args, nargs, kwn, kwv, nkw, line);                                          \
    } while (0)
#define NOARGS()                                                                                                    \
    do {                                                                                                            \
        if (nargs || nkw) jinja_raise(c->err, TSR_ERR_FORMAT, line, "filter '%s' takes no arguments", name);       \
    } while (0)

    if (!strcmp(name, "safe")) {
        NOARGS();
        return str_of(c, v);
    }
    if (!strcmp(name, "string")) {
        NOARGS();
        return str_of(c, v);
    }
    if (!strcmp(name, "e") || !strcmp(name, "escape") || !strcmp(name, "forceescape")) {
        NOARGS();
        return html_escape(c, str_of(c, v));
    }
    if (!strcmp(name, "trim")) {
        BIND("chars");
        return str_strip(c, str_of(c, v), a[0], 3, line);
    }
    if (!strcmp(name, "upper") || !strcmp(name, "lower")) {
        NOARGS();
        return str_case(c, str_of(c, v), name[0] == 'u' ? CASE_UPPER : CASE_LOWER);
    }
    if (!strcmp(name, "capitalize")) {
        NOARGS();
        return str_capitalize(c, str_of(c, v));
    }
    if (!strcmp(name, "title")) {
        NOARGS();
        return str_title_jinja(c, str_of(c, v));
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        NOARGS();
        switch (v.t) {
        case JV_STR: return jv_int((int64_t)utf8_len(v.u.s.p, v.u.s.n));
        case JV_LIST: return jv_int((int64_t)v.u.l->n);
        case JV_DICT: return jv_int((int64_t)v.u.d->n);
        case JV_UNDEF: return jv_int(0);
        case JV_LOOP: return jv_int((int64_t)((jloop *)v.u.ptr)->items.u.l->n);
        default: jinja_raise(c->err, TSR_ERR_FORMAT, line, "object of type '%s' has no len()", jv_type_name(v));
        }
    }
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        BIND("default_value", "boolean");
        jv dflt = a[0].t == JV_UNDEF ? empty_str() : a[0];
        if (v.t == JV_UNDEF || (is_true_default(a[1], 0) && !jv_truthy(v))) return dflt;
        return v;
    }
    if (!strcmp(name, "tojson")) {
        BIND("ensure_ascii", "indent", "separators", "sort_keys");
        return tojson(c, v, a, line);
    }
    if (!strcmp(name, "join")) {
        BIND("d", "attribute");
        jv sep = a[0].t == JV_UNDEF ? empty_str() : str_of(c, a[0]);
        jv items = jinja_to_list(c, v, line);
        jbuf b = {.a = c->a};
        for (size_t i = 0; i < items.u.l->n; i++) {
            if (i) jbuf_put(&b, sep.u.s.p, sep.u.s.n);
            jv it = items.u.l->v[i];
            if (a[1].t != JV_UNDEF && a[1].t != JV_NONE) it = attr_path(c, it, a[1], line);
            jv_to_str(&b, it);
        }
        return buf_val(&b);
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        NOARGS();
        if (v.t == JV_DICT && name[0] == 'l')
            jinja_raise(c->err, TSR_ERR_UNSUPPORTED, line, "unsupported construct: last of a mapping");
        jv items = jinja_to_list(c, v, line);
        if (!items.u.l->n) return jv_undef();
        return items.u.l->v[name[0] == 'f' ? 0 : items.u.l->n - 1];
    }
    if (!strcmp(name, "list")) {
        NOARGS();
        jv items = jinja_to_list(c, v, line);
        jv out = jv_list_new(c->a, items.u.l->n);
        for (size_t i = 0; i < items.u.l->n; i++) out.u.l->v[out.u.l->n++] = items.u.l->v[i];
        return out;
    }
    if (!strcmp(name, "int")) {
        BIND("default", "base");
        jv dflt = a[0].t == JV_UNDEF ? jv_int(0) : a[0];
        if (a[1].t != JV_UNDEF && !(a[1].t == JV_INT && a[1].u.i == 10))
            jinja_raise(c->err, TSR_ERR_UNSUPPORTED, line,
                        "unsupported construct: int filter with a base other than 10");
        if (v.t == JV_INT || v.t == JV_BOOL) return jv_int(v.u.i);
        if (v.t == JV_FLOAT) {
            if (!isfinite(v.u.f) || fabs(v.u.f) >= 9.2e18) return dflt;
            return jv_int((int64_t)v.u.f);
        }
        if (v.t == JV_STR) {
            int64_t iv;
            if (parse_int_str(v, &iv)) return jv_int(iv);
            double f;
            if (parse_float_str(c, v, &f) && isfinite(f) && fabs(f) < 9.2e18) return jv_int((int64_t)f);
        }
        return dflt;
    }
    if (!strcmp(name, "float")) {
        BIND("default");
        jv dflt = a[0].t == JV_UNDEF ? jv_float(0.0) : a[0];
        if (jv_is_number(v)) return jv_float(jv_num(v));
        double f;
        if (v.t == JV_STR && parse_float_str(c, v, &f)) return jv_float(f);
        return dflt;
    }
    if (!strcmp(name, "abs")) {
        NOARGS();
        if (v.t == JV_INT || v.t == JV_BOOL) {
            if (v.u.i == INT64_MIN) jinja_raise(c->err, TSR_ERR_UNSUPPORTED, line, "integer overflow");
            return jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        }
        if (v.t == JV_FLOAT) return jv_float(fabs(v.u.f));
        jinja_raise(c->err, TSR_ERR_FORMAT, line, "bad operand type for abs(): '%s'", jv_type_name(v));
    }
    if (!strcmp(name, "replace")) {
        BIND("old", "new", "count");
        jv s = str_of(c, v);
        jv old = want_str(c, str_of(c, a[0]), "replace old", line),
           rep = want_str(c, str_of(c, a[1]), "replace new", line);
        int64_t cnt = a[2].t == JV_UNDEF || a[2].t == JV_NONE ? -1 : want_int(c, a[2], "replace count", line);
        return str_replace(c, s, old, rep, cnt);
    }
    if (!strcmp(name, "map") || !strcmp(name, "select") || !strcmp(name, "reject") || !strcmp(name, "selectattr") ||
        !strcmp(name, "rejectattr"))
        return map_or_select(c, name, v, args, nargs, kwn, kwv, nkw, line);
    if (!strcmp(name, "items")) {
        NOARGS();
        if (v.t == JV_UNDEF) return jv_list_new(c->a, 0);
        if (v.t != JV_DICT && v.t != JV_NS)
            jinja_raise(c->err, TSR_ERR_FORMAT, line, "can only get item pairs from a mapping, not '%s'",
                        jv_type_name(v));
        jv out = jv_list_new(c->a, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++) {
            jv p = jv_list_new(c->a, 2);
            p.u.l->tuple = 1;
            p.u.l->v[0] = v.u.d->k[i];
            p.u.l->v[1] = v.u.d->v[i];
            p.u.l->n = 2;
            out.u.l->v[out.u.l->n++] = p;
        }
        return out;
    }
    if (!strcmp(name, "dictsort")) {
        BIND("case_sensitive", "by", "reverse");
        if (v.t != JV_DICT)
            jinja_raise(c->err, TSR_ERR_FORMAT, line, "dictsort needs a mapping, not '%s'", jv_type_name(v));
        int by_value = 0;
        if (a[1].t != JV_UNDEF) {
            if (jv_is_str(a[1], "value"))
                by_value = 1;
            else if (!jv_is_str(a[1], "key"))
                jinja_raise(c->err, TSR_ERR_FORMAT, line, "You can only sort by either \"key\" or \"value\"");
        }
        jv pairs = jinja_apply_filter(c, "items", v, NULL, 0, NULL, NULL, 0, line);
        return sorted(c, pairs, is_true_default(a[2], 0), is_true_default(a[0], 0), jv_undef(), by_value, line);
    }
    if (!strcmp(name, "sort")) {
        BIND("reverse", "case_sensitive", "attribute");
        return sorted(c, jinja_to_list(c, v, line), is_true_default(a[0], 0), is_true_default(a[1], 0), a[2], -1, line);
    }
    if (!strcmp(name, "reverse")) {
        NOARGS();
        if (v.t == JV_STR) {
            jv chars = jinja_to_list(c, v, line);
            jbuf b = {.a = c->a};
            for (size_t i = chars.u.l->n; i-- > 0;) jbuf_put(&b, chars.u.l->v[i].u.s.p, chars.u.l->v[i].u.s.n);
            return buf_val(&b);
        }
        jv items = jinja_to_list(c, v, line);
        jv out = jv_list_new(c->a, items.u.l->n);
        for (size_t i = items.u.l->n; i-- > 0;) out.u.l->v[out.u.l->n++] = items.u.l->v[i];
        return out;
    }
    if (!strcmp(name, "unique")) {
        BIND("case_sensitive", "attribute");
        return do_unique(c, v, a, line);
    }
    if (!strcmp(name, "min") || !strcmp(name, "max")) {
        BIND("case_sensitive", "attribute");
        return minmax(c, v, a, name[1] == 'a', line);
    }
    if (!strcmp(name, "sum")) {
        BIND("attribute", "start");
        jv acc = a[1].t == JV_UNDEF ? jv_int(0) : a[1];
        jv items = jinja_to_list(c, v, line);
        for (size_t i = 0; i < items.u.l->n; i++) {
            jv it = items.u.l->v[i];
            if (a[0].t != JV_UNDEF && a[0].t != JV_NONE) it = attr_path(c, it, a[0], line);
            if (!jv_is_number(acc) || !jv_is_number(it))
                jinja_raise(c->err, TSR_ERR_FORMAT, line, "sum(): unsupported operand types '%s' and '%s'",
                            jv_type_name(acc), jv_type_name(it));
            if (acc.t != JV_FLOAT && it.t != JV_FLOAT) {
                int64_t r;
                if (__builtin_add_overflow(acc.u.i, it.u.i, &r))
                    jinja_raise(c->err, TSR_ERR_UNSUPPORTED, line, "integer overflow");
                acc = jv_int(r);
            } else
                acc = jv_float(jv_num(acc) + jv_num(it));
        }
        return acc;
    }
    if (!strcmp(name, "round")) {
        BIND("precision", "method");
        int64_t prec = a[0].t == JV_UNDEF ? 0 : want_int(c, a[0], "round precision", line);
        if (!jv_is_number(v))
            jinja_raise(c->err, TSR_ERR_FORMAT, line, "round needs a number, not '%s'", jv_type_name(v));
        double x = jv_num(v);
        if (a[1].t == JV_UNDEF || jv_is_str(a[1], "common")) return jv_float(py_round(x, prec));
        double p = pow(10.0, (double)prec);
        if (jv_is_str(a[1], "ceil")) return jv_float(ceil(x * p) / p);
        if (jv_is_str(a[1], "floor")) return jv_float(floor(x * p) / p);
        jinja_raise(c->err, TSR_ERR_FORMAT, line, "method must be common, ceil or floor");
    }
    if (!strcmp(name, "wordcount")) {
        NOARGS();
        jv words = str_split(c, str_of(c, v), jv_undef(), -1, 0, line);
        return jv_int((int64_t)words.u.l->n);
    }
    if (!strcmp(name, "indent")) {
        BIND("width", "first", "blank");
        return do_indent(c, str_of(c, v), a, line);
    }
    if (!strcmp(name, "attr")) {
        BIND("name");
        jv nm = want_str(c, a[0], "attr name", line);
        if (v.t == JV_UNDEF) return v;
        return jinja_getattr(c, v, ja_strdup(c->a, nm.u.s.p, nm.u.s.n), line);
    }
    jinja_raise(c->err, TSR_ERR_UNSUPPORTED, line, "unsupported construct: filter '%s'", name);
#undef BIND
#undef NOARGS
}

/* ---- methods ---- */

static jv str_format(jctx *c, jv fmt, jv *args, size_t nargs, const char **kwn, jv *kwv, size_t nkw, int line)
{
    jbuf b = {.a = c->a};
    size_t auto_i = 0;
    const char *p = fmt.u.s.p;
    size_t n = fmt.u.s.n;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '{' && i + 1 < n && p[i + 1] == '{') {
            jbuf_putc(&b, '{');
            i++;
            continue;
        }
        if (p[i] == '}' && i + 1 < n && p[i + 1] == '}') {
            jbuf_putc(&b, '}');
            i++;
            continue;
        }
        if (p[i] == '}') jinja_raise(c->err, TSR_ERR_FORMAT, line, "str.format: single '}' encountered");
        if (p[i] != '{') {
            jbuf_putc(&b, p[i]);
            continue;
        }
        size_t e = i + 1;
        while (e < n && p[e] != '}') e++;
        if (e >= n) jinja_raise(c->err, TSR_ERR_FORMAT, line, "str.format: single '{' encountered");
        jv field = jv_str(p + i + 1, e - i - 1);
        for (size_t k = 0; k < field.u.s.n; k++)
            if (strchr(":!.[{", field.u.s.p[k]))
                jinja_raise(c->err, TSR_ERR_UNSUPPORTED, line, "unsupported construct: str.format field '{%.*s}'",
                            (int)field.u.s.n, field.u.s.p);
        jv val;
        int64_t idx;
        if (field.u.s.n == 0) {
            if (auto_i >= nargs)
                jinja_raise(c->err, TSR_ERR_FORMAT, line, "str.format: replacement index %zu out of range", auto_i);
            val = args[auto_i++];
        } else if (parse_int_str(field, &idx)) {
            if (idx < 0 || (size_t)idx >= nargs)
                jinja_raise(c->err, TSR_ERR_FORMAT, line, "str.format: replacement index %lld out of range",
                            (long long)idx);
            val = args[idx];
        } else {
            size_t k;
            for (k = 0; k < nkw; k++)
                if (strlen(kwn[k]) == field.u.s.n && !memcmp(kwn[k], field.u.s.p, field.u.s.n)) break;
            if (k == nkw)
                jinja_raise(c->err, TSR_ERR_FORMAT, line, "str.format: missing key '%.*s'", (int)field.u.s.n,
                            field.u.s.p);
            val = kwv[k];
        }
        jv_to_str(&b, val);
        i = e;
    }
    return buf_val(&b);
}

static int prefix_match(jctx *c, jv s, jv pre, int suffix, int line)
{
    if (pre.t == JV_LIST) {
        for (size_t i = 0; i < pre.u.l->n; i++)
            if (prefix_match(c, s, pre.u.l->v[i], suffix, line)) return 1;
        return 0;
    }
    pre = want_str(c, pre, suffix ? "endswith argument" : "startswith argument", line);
    if (pre.u.s.n > s.u.s.n) return 0;
    return !memcmp(s.u.s.p + (suffix ? s.u.s.n - pre.u.s.n : 0), pre.u.s.p, pre.u.s.n);
}

static int str_all(jv s, int (*pred)(uint32_t))
{
    if (!s.u.s.n) return 0;
    for (size_t i = 0; i < s.u.s.n;) {
        uint32_t cp;
        i = utf8_next(s.u.s.p, s.u.s.n, i, &cp);
        if (!pred(cp)) return 0;
    }
    return 1;
}

static int pred_digit(uint32_t cp)
{
    return cp <= 0x10ffff && utf8proc_category((utf8proc_int32_t)cp) == UTF8PROC_CATEGORY_ND;
}
static int pred_alpha(uint32_t cp)
{
    if (cp > 0x10ffff) return 0;
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
    return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}
static int pred_alnum(uint32_t cp) { return pred_alpha(cp) || pred_digit(cp); }
static int pred_space(uint32_t cp) { return py_isspace(cp); }

jv jinja_call_method(jctx *c, jv obj, const char *name, jv *args, size_t nargs, const char **kwn, jv *kwv,
                     size_t nkw, int line, int *handled)
{
    jv a[4];
#define MBIND(...)                                                                                                  \
    do {                                                                                                            \
        static const char *const params_[] = {__VA_ARGS__, NULL};                                                   \
        bind_args(c, name, params_, a, args, nargs, kwn, kwv, nkw, line);                                          \
    } while (0)
#define MNOARGS()                                                                                                   \
    do {                                                                                                            \
        if (nargs || nkw) jinja_raise(c->err, TSR_ERR_FORMAT, line, "%s() takes no arguments", name);              \
    } while (0)
    *handled = 1;
    if (obj.t == JV_STR) {
        jv s = obj;
        if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
            MBIND("prefix", "start", "end");
            if (a[1].t != JV_UNDEF || a[2].t != JV_UNDEF)
                jinja_raise(c->err, TSR_ERR_UNSUPPORTED, line, "unsupported construct: %s with start/end", name);
            return jv_bool(prefix_match(c, s, a[0], name[0] == 'e', line));
        }
        if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
            MBIND("chars");
            return str_strip(c, s, a[0], name[0] == 'l' ? 1 : name[0] == 'r' ? 2 : 3, line);
        }
        if (!strcmp(name, "split") || !strcmp(name, "rsplit")) {
            MBIND("sep", "maxsplit");
            int64_t ms = a[1].t == JV_UNDEF ? -1 : want_int(c, a[1], "maxsplit", line);
            return str_split(c, s, a[0], ms, name[0] == 'r', line);
        }
        if (!strcmp(name, "replace")) {
            MBIND("old", "new", "count");
            int64_t cnt = a[2].t == JV_UNDEF ? -1 : want_int(c, a[2], "count", line);
            return str_replace(c, s, want_str(c, a[0], "replace old", line), want_str(c, a[1], "replace new", line),
                               cnt);
        }
        if (!strcmp(name, "upper") || !strcmp(name, "lower")) {
            MNOARGS();
            return str_case(c, s, name[0] == 'u' ? CASE_UPPER : CASE_LOWER);
        }
        if (!strcmp(name, "title")) {
            MNOARGS();
            return str_title_py(c, s);
        }
        if (!strcmp(name, "capitalize")) {
            MNOARGS();
            return str_capitalize(c, s);
        }
        if (!strcmp(name, "find") || !strcmp(name, "rfind") || !strcmp(name, "index") || !strcmp(name, "rindex")) {
            MBIND("sub", "start", "end");
            if (a[1].t != JV_UNDEF || a[2].t != JV_UNDEF)
                jinja_raise(c->err, TSR_ERR_UNSUPPORTED, line, "unsupported construct: %s with start/end", name);
            jv sub = want_str(c, a[0], "substring", line);
            const char *f = NULL;
            if (name[0] == 'r') {
                if (sub.u.s.n <= s.u.s.n)
                    for (size_t k = s.u.s.n - sub.u.s.n + 1; k-- > 0;)
                        if (!memcmp(s.u.s.p + k, sub.u.s.p, sub.u.s.n)) {
                            f = s.u.s.p + k;
                            break;
                        }
            } else
                f = find_bytes(s.u.s.p, s.u.s.n, sub.u.s.p, sub.u.s.n);
            if (!f) {
                if (strstr(name, "index")) jinja_raise(c->err, TSR_ERR_FORMAT, line, "substring not found");
                return jv_int(-1);
            }
            return jv_int((int64_t)cp_index(s, (size_t)(f - s.u.s.p)));
        }
        if (!strcmp(name, "count")) {
            MBIND("sub");
            jv sub = want_str(c, a[0], "substring", line);
            if (!sub.u.s.n) return jv_int((int64_t)utf8_len(s.u.s.p, s.u.s.n) + 1);
            int64_t cnt = 0;
            size_t i = 0;
            const char *f;
            while ((f = find_bytes(s.u.s.p + i, s.u.s.n - i, sub.u.s.p, sub.u.s.n))) {
                cnt++;
                i = (size_t)(f - s.u.s.p) + sub.u.s.n;
            }
            return jv_int(cnt);
        }
        if (!strcmp(name, "format")) return str_format(c, s, args, nargs, kwn, kwv, nkw, line);
        if (!strcmp(name, "join")) {
            MBIND("iterable");
            jv items = jinja_to_list(c, a[0], line);
            jbuf b = {.a = c->a};
            for (size_t i = 0; i < items.u.l->n; i++) {
                if (i) jbuf_put(&b, s.u.s.p, s.u.s.n);
                jv it = want_str(c, items.u.l->v[i], "join item", line);
                jbuf_put(&b, it.u.s.p, it.u.s.n);
            }
            return buf_val(&b);
        }
        if (!strcmp(name, "isdigit")) return jv_bool(str_all(s, pred_digit));
        if (!strcmp(name, "isalpha")) return jv_bool(str_all(s, pred_alpha));
        if (!strcmp(name, "isalnum")) return jv_bool(str_all(s, pred_alnum));
        if (!strcmp(name, "isspace")) return jv_bool(str_all(s, pred_space));
        if (!strcmp(name, "islower") || !strcmp(name, "isupper"))
            return jv_bool(jinja_apply_test(c, name + 2, s, NULL, 0, line));
        *handled = 0;
        return jv_undef();
    }
    if (obj.t == JV_DICT) {
        if (!strcmp(name, "items")) {
            MNOARGS();
            return jinja_apply_filter(c, "items", obj, NULL, 0, NULL, NULL, 0, line);
        }
        if (!strcmp(name, "keys") || !strcmp(name, "values")) {
            MNOARGS();
            jv out = jv_list_new(c->a, obj.u.d->n);
            for (size_t i = 0; i < obj.u.d->n; i++)
                out.u.l->v[out.u.l->n++] = name[0] == 'k' ? obj.u.d->k[i] : obj.u.d->v[i];
            return out;
        }
        if (!strcmp(name, "get")) {
            MBIND("key", "default");
            jv *v = jv_dict_find_v(obj, a[0]);
            if (v) return *v;
            return a[1].t == JV_UNDEF ? jv_none() : a[1];
        }
        if (!strcmp(name, "copy")) return obj;
        static const char *const mut[] = {"clear", "pop", "popitem", "setdefault", "update", NULL};
        if (in_list(mut, name))
            jinja_raise(c->err, TSR_ERR_FORMAT, line,
                        "access to attribute '%s' of 'dict' object is unsafe (immutable sandbox)", name);
    }
    if (obj.t == JV_LIST) {
        static const char *const mut[] = {"append",  "extend", "insert", "pop", "remove",
                                          "reverse", "sort",   "clear",  NULL};
        if (in_list(mut, name))
            jinja_raise(c->err, TSR_ERR_FORMAT, line,
                        "access to attribute '%s' of 'list' object is unsafe (immutable sandbox)", name);
        if (!strcmp(name, "index") || !strcmp(name, "count")) {
            MBIND("value");
            int64_t cnt = 0;
            for (size_t i = 0; i < obj.u.l->n; i++)
                if (jv_equal(obj.u.l->v[i], a[0])) {
                    if (name[0] == 'i') return jv_int((int64_t)i);
                    cnt++;
                }
            if (name[0] == 'i') jinja_raise(c->err, TSR_ERR_FORMAT, line, "list.index(x): x not in list");
            return jv_int(cnt);
        }
    }
    if (obj.t == JV_LOOP && !strcmp(name, "cycle")) {
        if (!nargs) jinja_raise(c->err, TSR_ERR_FORMAT, line, "no items for cycling given");
        return args[((jloop *)obj.u.ptr)->index0 % nargs];
    }
    if (obj.t == JV_DICT || obj.t == JV_NS) { /* a non-method attribute that is not callable */
        jv v = jinja_getattr(c, obj, name, line);
        if (v.t == JV_UNDEF) jinja_undefined_error(c, v, line);
        jinja_raise(c->err, TSR_ERR_FORMAT, line, "'%s' object is not callable", jv_type_name(v));
    }
    *handled = 0;
    return jv_undef();
#undef MBIND
#undef MNOARGS
}
