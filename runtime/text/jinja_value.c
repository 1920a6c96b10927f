/* Arena, values and their Python-compatible conversions for the chat-template interpreter (see jinja_value.h).
 *
 * The arena hands out zeroed blocks from large chunks and enforces an optional byte limit, so a hostile template
 * (exponential string doubling, huge ranges) fails with an error instead of exhausting memory. str()/repr()
 * reproduce CPython's output for the types a template can build (float repr uses the shortest round-trip digits
 * with CPython's fixed/scientific switch), and jv_to_json reproduces json.dumps as transformers calls it. */
#include "runtime/text/jinja_value.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct jinja_chunk {
    jinja_chunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

_Noreturn void jinja_raise(jinja_err *err, tsr_status st, int line, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (line > 0)
        tsr_fail(st, "chat template: %s (template line %d)", msg, line);
    else
        tsr_fail(st, "chat template: %s", msg);
    err->status = st;
    longjmp(err->jb, 1);
}

void *ja_alloc(jinja_arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    jinja_chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t sz = n > (size_t)1 << 16 ? n : (size_t)1 << 16;
        if (a->limit && a->used_total + sz > a->limit)
            jinja_raise(a->err, TSR_ERR_NOMEM, 0, "memory limit of %zu bytes exceeded while rendering", a->limit);
        c = malloc(sizeof *c + sz);
        if (!c) jinja_raise(a->err, TSR_ERR_NOMEM, 0, "out of memory (%zu bytes)", sz);
        c->size = sz;
        c->used = 0;
        a->used_total += sz;
        if (a->head && n != sz) {
            c->next = a->head;
            a->head = c;
        } else if (a->head) { /* a dedicated big block: keep the current chunk at the head */
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = NULL;
            a->head = c;
        }
    }
    void *p = c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

char *ja_strdup(jinja_arena *a, const char *s, size_t n)
{
    char *p = ja_alloc(a, n + 1);
    if (n) memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

void ja_free_all(jinja_arena *a)
{
    jinja_chunk *c = a->head;
    while (c) {
        jinja_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->used_total = 0;
}

/* ---- buffers ---- */

static void jbuf_reserve(jbuf *b, size_t extra)
{
    if (b->n + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap * 2 : 64;
    while (cap < b->n + extra + 1) cap *= 2;
    char *p = ja_alloc(b->a, cap);
    if (b->n) memcpy(p, b->p, b->n);
    b->p = p;
    b->cap = cap;
}

void jbuf_put(jbuf *b, const char *s, size_t n)
{
    if (!n) return;
    jbuf_reserve(b, n);
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

void jbuf_puts(jbuf *b, const char *s) { jbuf_put(b, s, strlen(s)); }
void jbuf_putc(jbuf *b, char c) { jbuf_put(b, &c, 1); }

void jbuf_printf(jbuf *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        jbuf_put(b, tmp, (size_t)n);
        return;
    }
    jbuf_reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}

jv jbuf_value(jbuf *b) { return jv_str(b->p ? b->p : "", b->n); }

/* ---- constructors ---- */

jv jv_undef(void) { return (jv){.t = JV_UNDEF}; }
jv jv_none(void) { return (jv){.t = JV_NONE}; }
jv jv_bool(int b) { return (jv){.t = JV_BOOL, .u.i = b ? 1 : 0}; }
jv jv_int(int64_t i) { return (jv){.t = JV_INT, .u.i = i}; }
jv jv_float(double f) { return (jv){.t = JV_FLOAT, .u.f = f}; }
jv jv_str(const char *p, size_t n)
{
    jv v = {.t = JV_STR};
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}
jv jv_cstr(const char *p) { return jv_str(p, strlen(p)); }

jv jv_list_new(jinja_arena *a, size_t cap)
{
    jv v = {.t = JV_LIST};
    v.u.l = ja_alloc(a, sizeof(jlist));
    if (cap) {
        v.u.l->v = ja_alloc(a, cap * sizeof(jv));
        v.u.l->cap = cap;
    }
    return v;
}

jv jv_dict_new(jinja_arena *a, size_t cap)
{
    jv v = {.t = JV_DICT};
    v.u.d = ja_alloc(a, sizeof(jdict));
    if (cap) {
        v.u.d->k = ja_alloc(a, cap * sizeof(jv));
        v.u.d->v = ja_alloc(a, cap * sizeof(jv));
        v.u.d->cap = cap;
    }
    return v;
}

void jv_list_push(jinja_arena *a, jv list, jv item)
{
    jlist *l = list.u.l;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        jv *nv = ja_alloc(a, cap * sizeof(jv));
        if (l->n) memcpy(nv, l->v, l->n * sizeof(jv));
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = item;
}

jv *jv_dict_find_v(jv dict, jv key)
{
    jdict *d = dict.u.d;
    for (size_t i = 0; i < d->n; i++)
        if (jv_equal(d->k[i], key)) return &d->v[i];
    return NULL;
}

jv *jv_dict_find(jv dict, const char *key, size_t n)
{
    jdict *d = dict.u.d;
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == JV_STR && d->k[i].u.s.n == n && !memcmp(d->k[i].u.s.p, key, n)) return &d->v[i];
    return NULL;
}

void jv_dict_set(jinja_arena *a, jv dict, jv key, jv val)
{
    jv *slot = jv_dict_find_v(dict, key);
    if (slot) {
        *slot = val;
        return;
    }
    jdict *d = dict.u.d;
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        jv *nk = ja_alloc(a, cap * sizeof(jv));
        jv *nv = ja_alloc(a, cap * sizeof(jv));
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof(jv));
            memcpy(nv, d->v, d->n * sizeof(jv));
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = key;
    d->v[d->n] = val;
    d->n++;
}

/* ---- predicates ---- */

int jv_truthy(jv v)
{
    switch (v.t) {
    case JV_UNDEF:
    case JV_NONE: return 0;
    case JV_BOOL:
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0.0;
    case JV_STR: return v.u.s.n != 0;
    case JV_LIST: return v.u.l->n != 0;
    case JV_DICT: return v.u.d->n != 0;
    default: return 1;
    }
}

int jv_is_number(jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
double jv_num(jv v) { return v.t == JV_FLOAT ? v.u.f : (double)v.u.i; }

int jv_is_str(jv v, const char *s) { return v.t == JV_STR && v.u.s.n == strlen(s) && !memcmp(v.u.s.p, s, v.u.s.n); }

int jv_equal(jv a, jv b)
{
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) return a.u.i == b.u.i;
        return jv_num(a) == jv_num(b);
    }
    if (a.t != b.t) return 0;
    switch (a.t) {
    case JV_UNDEF:
    case JV_NONE: return 1;
    case JV_STR: return a.u.s.n == b.u.s.n && !memcmp(a.u.s.p, b.u.s.p, a.u.s.n);
    case JV_LIST:
        if (a.u.l->n != b.u.l->n) return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!jv_equal(a.u.l->v[i], b.u.l->v[i])) return 0;
        return 1;
    case JV_DICT:
        if (a.u.d->n != b.u.d->n) return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            jv *o = jv_dict_find_v(b, a.u.d->k[i]);
            if (!o || !jv_equal(a.u.d->v[i], *o)) return 0;
        }
        return 1;
    default: return a.u.ptr == b.u.ptr;
    }
}

const char *jv_type_name(jv v)
{
    switch (v.t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return v.u.l->tuple ? "tuple" : "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_MACRO: return "Macro";
    case JV_FUNC: return "function";
    case JV_LOOP: return "LoopContext";
    }
    return "object";
}

/* ---- UTF-8 ---- */

size_t utf8_next(const char *p, size_t n, size_t i, uint32_t *cp)
{
    const unsigned char *s = (const unsigned char *)p;
    unsigned c = s[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > n) {
        *cp = c;
        return i + 1;
    }
    uint32_t v = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    for (size_t k = 1; k < len; k++) {
        if ((s[i + k] & 0xc0) != 0x80) {
            *cp = c;
            return i + 1;
        }
        v = (v << 6) | (s[i + k] & 0x3f);
    }
    *cp = v;
    return i + len;
}

size_t utf8_len(const char *p, size_t n)
{
    size_t count = 0;
    uint32_t cp;
    for (size_t i = 0; i < n; i = utf8_next(p, n, i, &cp)) count++;
    return count;
}

size_t utf8_put(char *out, uint32_t cp)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xc0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xe0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    if (cp > 0x10ffff) cp = 0xfffd;
    o[0] = (unsigned char)(0xf0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

int py_isspace(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
           c == 0x3000;
}

/* ---- str / repr ---- */

void jv_float_repr(jbuf *b, double f)
{
    if (isnan(f)) {
        jbuf_puts(b, "nan");
        return;
    }
    if (isinf(f)) {
        jbuf_puts(b, f < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[64];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp: [-]d[.ddd]e[+-]XX */
    const char *s = tmp;
    int neg = 0;
    if (*s == '-') {
        neg = 1;
        s++;
    }
    char digits[32];
    int nd = 0;
    const char *e = strchr(s, 'e');
    for (const char *q = s; q < e; q++)
        if (*q != '.') digits[nd++] = *q;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    int exp10 = atoi(e + 1);
    int decpt = exp10 + 1;
    if (neg) jbuf_putc(b, '-');
    if (decpt > 16 || decpt < -3) {
        jbuf_putc(b, digits[0]);
        if (nd > 1) {
            jbuf_putc(b, '.');
            jbuf_put(b, digits + 1, (size_t)nd - 1);
        }
        jbuf_printf(b, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    } else if (decpt <= 0) {
        jbuf_puts(b, "0.");
        for (int i = 0; i < -decpt; i++) jbuf_putc(b, '0');
        jbuf_put(b, digits, (size_t)nd);
    } else if (decpt >= nd) {
        jbuf_put(b, digits, (size_t)nd);
        for (int i = nd; i < decpt; i++) jbuf_putc(b, '0');
        jbuf_puts(b, ".0");
    } else {
        jbuf_put(b, digits, (size_t)decpt);
        jbuf_putc(b, '.');
        jbuf_put(b, digits + decpt, (size_t)(nd - decpt));
    }
}

static void str_repr(jbuf *b, const char *p, size_t n)
{
    int has_sq = memchr(p, '\'', n) != NULL, has_dq = memchr(p, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jbuf_putc(b, q);
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t nx = utf8_next(p, n, i, &cp);
        if (cp == (uint32_t)q || cp == '\\') {
            jbuf_putc(b, '\\');
            jbuf_putc(b, (char)cp);
        } else if (cp == '\n')
            jbuf_puts(b, "\\n");
        else if (cp == '\r')
            jbuf_puts(b, "\\r");
        else if (cp == '\t')
            jbuf_puts(b, "\\t");
        else if (cp < 0x20 || (cp >= 0x7f && cp < 0xa0) || cp == 0xad)
            jbuf_printf(b, "\\x%02x", (unsigned)cp);
        else
            jbuf_put(b, p + i, nx - i);
        i = nx;
    }
    jbuf_putc(b, q);
}

void jv_repr(jbuf *b, jv v)
{
    switch (v.t) {
    case JV_STR: str_repr(b, v.u.s.p, v.u.s.n); return;
    case JV_LIST:
        jbuf_putc(b, v.u.l->tuple ? '(' : '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) jbuf_puts(b, ", ");
            jv_repr(b, v.u.l->v[i]);
        }
        if (v.u.l->tuple && v.u.l->n == 1) jbuf_putc(b, ',');
        jbuf_putc(b, v.u.l->tuple ? ')' : ']');
        return;
    case JV_DICT:
        jbuf_putc(b, '{');
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) jbuf_puts(b, ", ");
            jv_repr(b, v.u.d->k[i]);
            jbuf_puts(b, ": ");
            jv_repr(b, v.u.d->v[i]);
        }
        jbuf_putc(b, '}');
        return;
    default: jv_to_str(b, v); return;
    }
}

void jv_to_str(jbuf *b, jv v)
{
    switch (v.t) {
    case JV_UNDEF: return;
    case JV_NONE: jbuf_puts(b, "None"); return;
    case JV_BOOL: jbuf_puts(b, v.u.i ? "True" : "False"); return;
    case JV_INT: jbuf_printf(b, "%lld", (long long)v.u.i); return;
    case JV_FLOAT: jv_float_repr(b, v.u.f); return;
    case JV_STR: jbuf_put(b, v.u.s.p, v.u.s.n); return;
    case JV_LIST:
    case JV_DICT: jv_repr(b, v); return;
    case JV_NS:
        jbuf_puts(b, "<Namespace ");
        {
            jv d = v;
            d.t = JV_DICT;
            jv_repr(b, d);
        }
        jbuf_putc(b, '>');
        return;
    case JV_MACRO: jbuf_puts(b, "<Macro>"); return;
    case JV_FUNC: jbuf_puts(b, "<function>"); return;
    case JV_LOOP: jbuf_puts(b, "<LoopContext>"); return;
    }
}

/* ---- JSON ---- */

static void json_str(jbuf *b, const char *p, size_t n, int ascii)
{
    jbuf_putc(b, '"');
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t nx = utf8_next(p, n, i, &cp);
        switch (cp) {
        case '"': jbuf_puts(b, "\\\""); break;
        case '\\': jbuf_puts(b, "\\\\"); break;
        case '\n': jbuf_puts(b, "\\n"); break;
        case '\r': jbuf_puts(b, "\\r"); break;
        case '\t': jbuf_puts(b, "\\t"); break;
        case '\b': jbuf_puts(b, "\\b"); break;
        case '\f': jbuf_puts(b, "\\f"); break;
        default:
            if (cp < 0x20)
                jbuf_printf(b, "\\u%04x", (unsigned)cp);
            else if (ascii && cp >= 0x7f) {
                if (cp >= 0x10000) {
                    uint32_t c = cp - 0x10000;
                    jbuf_printf(b, "\\u%04x\\u%04x", (unsigned)(0xd800 | (c >> 10)), (unsigned)(0xdc00 | (c & 0x3ff)));
                } else
                    jbuf_printf(b, "\\u%04x", (unsigned)cp);
            } else
                jbuf_put(b, p + i, nx - i);
        }
        i = nx;
    }
    jbuf_putc(b, '"');
}

static void json_float(jbuf *b, double f)
{
    if (isnan(f))
        jbuf_puts(b, "NaN");
    else if (isinf(f))
        jbuf_puts(b, f < 0 ? "-Infinity" : "Infinity");
    else
        jv_float_repr(b, f);
}

static void json_newline(jbuf *b, const char *indent, int depth)
{
    jbuf_putc(b, '\n');
    for (int i = 0; i < depth; i++) jbuf_puts(b, indent);
}

typedef struct {
    const char *indent, *item_sep, *key_sep;
    int sort_keys, ascii, line;
    jinja_err *err;
} json_opts;

static int key_cmp(const void *x, const void *y)
{
    const jv *a = *(const jv *const *)x, *c = *(const jv *const *)y;
    size_t n = a->u.s.n < c->u.s.n ? a->u.s.n : c->u.s.n;
    int r = memcmp(a->u.s.p, c->u.s.p, n);
    if (r) return r;
    return a->u.s.n < c->u.s.n ? -1 : a->u.s.n > c->u.s.n;
}

static void json_value(jbuf *b, jv v, const json_opts *o, int depth)
{
    if (depth > 200) jinja_raise(o->err, TSR_ERR_FORMAT, o->line, "tojson: value nested too deeply");
    switch (v.t) {
    case JV_NONE: jbuf_puts(b, "null"); return;
    case JV_BOOL: jbuf_puts(b, v.u.i ? "true" : "false"); return;
    case JV_INT: jbuf_printf(b, "%lld", (long long)v.u.i); return;
    case JV_FLOAT: json_float(b, v.u.f); return;
    case JV_STR: json_str(b, v.u.s.p, v.u.s.n, o->ascii); return;
    case JV_LIST:
        if (!v.u.l->n) {
            jbuf_puts(b, "[]");
            return;
        }
        jbuf_putc(b, '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) jbuf_puts(b, o->item_sep);
            if (o->indent) json_newline(b, o->indent, depth + 1);
            json_value(b, v.u.l->v[i], o, depth + 1);
        }
        if (o->indent) json_newline(b, o->indent, depth);
        jbuf_putc(b, ']');
        return;
    case JV_DICT: {
        jdict *d = v.u.d;
        if (!d->n) {
            jbuf_puts(b, "{}");
            return;
        }
        /* keys: str as is; int/float/bool/None converted like json.dumps does */
        jv **order = ja_alloc(b->a, d->n * sizeof(jv *));
        jv *keys = ja_alloc(b->a, d->n * sizeof(jv));
        for (size_t i = 0; i < d->n; i++) {
            jv k = d->k[i];
            if (k.t != JV_STR) {
                jbuf kb = {.a = b->a};
                if (k.t == JV_BOOL)
                    jbuf_puts(&kb, k.u.i ? "true" : "false");
                else if (k.t == JV_NONE)
                    jbuf_puts(&kb, "null");
                else if (k.t == JV_INT)
                    jbuf_printf(&kb, "%lld", (long long)k.u.i);
                else if (k.t == JV_FLOAT)
                    json_float(&kb, k.u.f);
                else
                    jinja_raise(o->err, TSR_ERR_FORMAT, o->line,
                                "tojson: keys must be str, int, float, bool or None, not %s", jv_type_name(k));
                k = jbuf_value(&kb);
            }
            keys[i] = k;
            order[i] = &keys[i];
        }
        if (o->sort_keys) qsort(order, d->n, sizeof *order, key_cmp);
        jbuf_putc(b, '{');
        for (size_t i = 0; i < d->n; i++) {
            size_t idx = (size_t)(order[i] - keys);
            if (i) jbuf_puts(b, o->item_sep);
            if (o->indent) json_newline(b, o->indent, depth + 1);
            json_str(b, keys[idx].u.s.p, keys[idx].u.s.n, o->ascii);
            jbuf_puts(b, o->key_sep);
            json_value(b, d->v[idx], o, depth + 1);
        }
        if (o->indent) json_newline(b, o->indent, depth);
        jbuf_putc(b, '}');
        return;
    }
    default:
        jinja_raise(o->err, TSR_ERR_FORMAT, o->line, "tojson: Object of type %s is not JSON serializable",
                    jv_type_name(v));
    }
}

void jv_to_json(jbuf *b, jv v, const char *indent_str, const char *item_sep, const char *key_sep, int sort_keys,
                int ascii, jinja_err *err, int line)
{
    json_opts o = {indent_str, item_sep, key_sep, sort_keys, ascii, line, err};
    json_value(b, v, &o, 0);
}

jv jv_from_json(jinja_arena *a, const json_t *j)
{
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jv d = jv_dict_new(a, json_object_size(j));
        const char *k;
        json_t *val;
        json_object_foreach((json_t *)j, k, val) {
            jdict *dd = d.u.d;
            dd->k[dd->n] = jv_str(ja_strdup(a, k, strlen(k)), strlen(k));
            dd->v[dd->n] = jv_from_json(a, val);
            dd->n++;
        }
        return d;
    }
    case JSON_ARRAY: {
        jv l = jv_list_new(a, json_array_size(j));
        for (size_t i = 0; i < json_array_size(j); i++) l.u.l->v[l.u.l->n++] = jv_from_json(a, json_array_get(j, i));
        return l;
    }
    case JSON_STRING: {
        size_t n = json_string_length(j);
        return jv_str(ja_strdup(a, json_string_value(j), n), n);
    }
    case JSON_INTEGER: return jv_int((int64_t)json_integer_value(j));
    case JSON_REAL: return jv_float(json_real_value(j));
    case JSON_TRUE: return jv_bool(1);
    case JSON_FALSE: return jv_bool(0);
    default: return jv_none();
    }
}
