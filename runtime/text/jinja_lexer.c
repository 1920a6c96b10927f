/* Lexer of the chat-template interpreter (see jinja_lexer.h).
 *
 * Works like Jinja2's regex lexer: the root state looks for the earliest "{{", "{%" or "{#", applies the
 * whitespace rules to the data before it, then the tag state reads expression tokens until the matching end
 * marker ("}}" / "%}" only count as an end when no bracket is open, as in Jinja). String literals are decoded with
 * Python's unicode-escape rules, which is what Jinja does. */
#include "runtime/text/jinja_lexer.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    jinja_arena *a;
    const char *s;
    size_t n, pos;
    int line;
    jtoken *toks;
    size_t nt, cap;
} lexer;

static jtoken *push(lexer *L, jtok_type t, int line, const char *p, size_t n)
{
    if (L->nt == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 64;
        jtoken *nt = ja_alloc(L->a, cap * sizeof *nt);
        if (L->nt) memcpy(nt, L->toks, L->nt * sizeof *nt);
        L->toks = nt;
        L->cap = cap;
    }
    jtoken *t0 = &L->toks[L->nt++];
    memset(t0, 0, sizeof *t0);
    t0->t = t;
    t0->line = line;
    t0->p = p;
    t0->n = n;
    return t0;
}

static int count_nl(const char *p, size_t n)
{
    int c = 0;
    for (size_t i = 0; i < n; i++) c += p[i] == '\n';
    return c;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* Emits data text[0..n) after applying the strip rules for a following tag (kind '{','%','#', sign '-','+',0). */
static void emit_data(lexer *L, const char *text, size_t n, char kind, char sign, int line_starting)
{
    size_t keep = n;
    if (sign == '-') {
        while (keep > 0 && is_ws(text[keep - 1])) keep--;
    } else if (sign != '+' && kind != '{' && kind != 0) {
        size_t l_pos = n;
        while (l_pos > 0 && text[l_pos - 1] != '\n') l_pos--;
        if (l_pos > 0 || line_starting) {
            int only = 1;
            for (size_t i = l_pos; i < n; i++)
                if (text[i] != ' ' && text[i] != '\t') {
                    only = 0;
                    break;
                }
            if (only) keep = l_pos;
        }
    }
    if (keep) push(L, TK_DATA, L->line, text, keep);
    L->line += count_nl(text, n);
}

static _Noreturn void lex_fail(lexer *L, int line, const char *msg)
{
    jinja_raise(L->a->err, TSR_ERR_FORMAT, line, "syntax error: %s", msg);
}

/* Decodes a string literal body with Python's unicode-escape semantics. */
static void decode_string(lexer *L, jtoken *t, const char *p, size_t n)
{
    char *out = ja_alloc(L->a, n + 1);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c != '\\' || i + 1 >= n) {
            out[o++] = c;
            continue;
        }
        char e = p[++i];
        uint32_t cp;
        int digits = 0;
        switch (e) {
        case 'n': out[o++] = '\n'; break;
        case 't': out[o++] = '\t'; break;
        case 'r': out[o++] = '\r'; break;
        case '\\': out[o++] = '\\'; break;
        case '\'': out[o++] = '\''; break;
        case '"': out[o++] = '"'; break;
        case 'a': out[o++] = '\a'; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'v': out[o++] = '\v'; break;
        case '\n': break; /* line continuation */
        case 'x': digits = 2; goto hex;
        case 'u': digits = 4; goto hex;
        case 'U':
            digits = 8;
        hex:
            cp = 0;
            for (int k = 0; k < digits; k++) {
                if (i + 1 + (size_t)k >= n || !isxdigit((unsigned char)p[i + 1 + (size_t)k]))
                    lex_fail(L, t->line, "truncated \\x/\\u/\\U escape in a string literal");
                char h = p[i + 1 + (size_t)k];
                cp = cp * 16 + (uint32_t)(isdigit((unsigned char)h) ? h - '0' : (tolower((unsigned char)h) - 'a' + 10));
            }
            if (cp > 0x10ffff) lex_fail(L, t->line, "illegal Unicode character in a string literal");
            i += (size_t)digits;
            o += utf8_put(out + o, cp);
            break;
        default:
            if (e >= '0' && e <= '7') {
                cp = 0;
                int k = 0;
                while (k < 3 && i < n && p[i] >= '0' && p[i] <= '7') {
                    cp = cp * 8 + (uint32_t)(p[i] - '0');
                    i++;
                    k++;
                }
                i--;
                o += utf8_put(out + o, cp);
            } else {
                out[o++] = '\\';
                out[o++] = e;
            }
        }
    }
    out[o] = '\0';
    t->p = out;
    t->n = o;
}

/* Reads expression tokens of a {{ }} or {% %} tag; returns after its end marker. */
static void lex_tag(lexer *L, char kind, int *line_starting)
{
    const char *s = L->s;
    size_t n = L->n;
    int depth = 0;
    int start_line = L->line;
    for (;;) {
        while (L->pos < n && is_ws(s[L->pos])) {
            if (s[L->pos] == '\n') L->line++;
            L->pos++;
        }
        if (L->pos >= n) lex_fail(L, start_line, kind == '%' ? "unexpected end of template: missing '%}'"
                                                             : "unexpected end of template: missing '}}'");
        size_t p = L->pos;
        char close = kind == '%' ? '%' : '}';
        if (depth == 0) {
            char sign = 0;
            size_t q = p;
            if (s[q] == '-' || s[q] == '+') {
                sign = s[q];
                q++;
            }
            if (q + 1 < n && s[q] == close && s[q + 1] == '}' && !(sign == '+' && kind == '{')) {
                push(L, kind == '%' ? TK_BLOCK_END : TK_VAR_END, L->line, s + p, q + 2 - p);
                L->pos = q + 2;
                if (sign == '-') {
                    while (L->pos < n && is_ws(s[L->pos])) {
                        if (s[L->pos] == '\n') L->line++;
                        L->pos++;
                    }
                } else if (sign == 0 && kind == '%' && L->pos < n && s[L->pos] == '\n') {
                    L->pos++;
                    L->line++;
                }
                *line_starting = L->pos > 0 && s[L->pos - 1] == '\n';
                return;
            }
        }
        char c = s[p];
        if (isalpha((unsigned char)c) || c == '_') {
            size_t q = p;
            while (q < n && (isalnum((unsigned char)s[q]) || s[q] == '_')) q++;
            push(L, TK_NAME, L->line, s + p, q - p);
            L->pos = q;
            continue;
        }
        if (isdigit((unsigned char)c)) {
            size_t q = p;
            int is_float = 0;
            int after_dot = p > 0 && s[p - 1] == '.';
            while (q < n &&
                   (isdigit((unsigned char)s[q]) || (s[q] == '_' && q + 1 < n && isdigit((unsigned char)s[q + 1]))))
                q++;
            if (!after_dot && q + 1 < n && s[q] == '.' && isdigit((unsigned char)s[q + 1])) {
                is_float = 1;
                q++;
                while (q < n && (isdigit((unsigned char)s[q]) || s[q] == '_')) q++;
            }
            if (!after_dot && q < n && (s[q] == 'e' || s[q] == 'E')) {
                size_t r = q + 1;
                if (r < n && (s[r] == '+' || s[r] == '-')) r++;
                if (r < n && isdigit((unsigned char)s[r])) {
                    is_float = 1;
                    q = r;
                    while (q < n && isdigit((unsigned char)s[q])) q++;
                }
            }
            char buf[128];
            size_t bn = 0;
            for (size_t k = p; k < q && bn < sizeof buf - 1; k++)
                if (s[k] != '_') buf[bn++] = s[k];
            buf[bn] = '\0';
            jtoken *t = push(L, is_float ? TK_FLOAT : TK_INT, L->line, s + p, q - p);
            if (is_float)
                t->f = strtod(buf, NULL);
            else {
                char *end;
                errno = 0;
                unsigned long long v = strtoull(buf, &end, 10);
                if (errno || v > (unsigned long long)INT64_MAX) lex_fail(L, L->line, "integer literal too large");
                t->i = (int64_t)v;
            }
            L->pos = q;
            continue;
        }
        if (c == '\'' || c == '"') {
            size_t q = p + 1;
            int nl = 0;
            while (q < n && s[q] != c) {
                if (s[q] == '\\' && q + 1 < n) {
                    if (s[q + 1] == '\n') nl++;
                    q++;
                }
                if (s[q] == '\n') nl++;
                q++;
            }
            if (q >= n) lex_fail(L, L->line, "unterminated string literal");
            jtoken *t = push(L, TK_STRING, L->line, NULL, 0);
            decode_string(L, t, s + p + 1, q - p - 1);
            L->line += nl;
            L->pos = q + 1;
            continue;
        }
        static const char *ops2[] = {"//", "**", "==", "!=", "<=", ">="};
        size_t oplen = 0;
        for (size_t k = 0; k < sizeof ops2 / sizeof ops2[0]; k++)
            if (p + 1 < n && s[p] == ops2[k][0] && s[p + 1] == ops2[k][1]) oplen = 2;
        if (!oplen && strchr("+-*/%~<>=.,:|()[]{};", c) && c) oplen = 1;
        if (!oplen) {
            char msg[64];
            snprintf(msg, sizeof msg, "unexpected character '%c'", isprint((unsigned char)c) ? c : '?');
            lex_fail(L, L->line, msg);
        }
        if (c == '(' || c == '[' || c == '{') depth++;
        if ((c == ')' || c == ']' || c == '}') && depth > 0) depth--;
        push(L, TK_OP, L->line, s + p, oplen);
        L->pos = p + oplen;
    }
}

/* Matches "{%[-+]?\s*NAME\s*[-+]?%}" at i; returns its end or 0. *end_sign receives the sign before "%}". */
static size_t match_simple_tag(const char *s, size_t n, size_t i, const char *name, char *open_sign, char *end_sign)
{
    if (i + 2 > n || s[i] != '{' || s[i + 1] != '%') return 0;
    size_t q = i + 2;
    *open_sign = 0;
    if (q < n && (s[q] == '-' || s[q] == '+')) *open_sign = s[q++];
    while (q < n && is_ws(s[q])) q++;
    size_t ln = strlen(name);
    if (q + ln > n || memcmp(s + q, name, ln)) return 0;
    q += ln;
    if (q < n && (isalnum((unsigned char)s[q]) || s[q] == '_')) return 0;
    while (q < n && is_ws(s[q])) q++;
    *end_sign = 0;
    if (q < n && (s[q] == '-' || s[q] == '+')) *end_sign = s[q++];
    if (q + 2 > n || s[q] != '%' || s[q + 1] != '}') return 0;
    return q + 2;
}

void jinja_lex(jinja_arena *a, const char *src, size_t n, jtoken **out, size_t *count)
{
    /* normalize newlines; drop one trailing newline */
    char *s = ja_alloc(a, n + 1);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (src[i] == '\r') {
            s[m++] = '\n';
            if (i + 1 < n && src[i + 1] == '\n') i++;
        } else
            s[m++] = src[i];
    }
    if (m > 0 && s[m - 1] == '\n') m--;
    s[m] = '\0';

    lexer L = {.a = a, .s = s, .n = m, .pos = 0, .line = 1};
    int line_starting = 1;
    while (L.pos < m) {
        size_t i = L.pos;
        size_t t = i;
        while (t + 1 < m && !(s[t] == '{' && (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#'))) t++;
        if (t + 1 >= m) { /* no more tags */
            emit_data(&L, s + i, m - i, 0, 0, line_starting);
            L.pos = m;
            break;
        }
        char kind = s[t + 1];
        char sign = (t + 2 < m && (s[t + 2] == '-' || s[t + 2] == '+')) ? s[t + 2] : 0;
        char osign, esign;
        size_t raw_end = kind == '%' ? match_simple_tag(s, m, t, "raw", &osign, &esign) : 0;
        emit_data(&L, s + i, t - i, kind, sign, line_starting);
        if (raw_end) {
            int raw_line = L.line;
            L.line += count_nl(s + t, raw_end - t);
            size_t q = raw_end;
            if (esign == '-')
                while (q < m && is_ws(s[q])) q++;
            L.line += count_nl(s + raw_end, q - raw_end);
            size_t body = q, e = q, e_end = 0;
            char o2 = 0, e2 = 0;
            for (; e + 1 < m; e++)
                if ((e_end = match_simple_tag(s, m, e, "endraw", &o2, &e2))) break;
            if (!e_end) lex_fail(&L, raw_line, "missing '{% endraw %}'");
            int ls = body > 0 && s[body - 1] == '\n';
            emit_data(&L, s + body, e - body, '%', o2, ls);
            L.line += count_nl(s + e, e_end - e);
            L.pos = e_end;
            if (e2 == '-')
                while (L.pos < m && is_ws(s[L.pos])) {
                    if (s[L.pos] == '\n') L.line++;
                    L.pos++;
                }
            else if (e2 != '+' && L.pos < m && s[L.pos] == '\n') {
                L.pos++;
                L.line++;
            }
            line_starting = L.pos > 0 && s[L.pos - 1] == '\n';
            continue;
        }
        size_t body = t + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            size_t e = body;
            while (e + 1 < m && !(s[e] == '#' && s[e + 1] == '}')) e++;
            if (e + 1 >= m) lex_fail(&L, L.line, "missing end of comment tag '#}'");
            char esg = (e > body && (s[e - 1] == '-' || s[e - 1] == '+')) ? s[e - 1] : 0;
            L.line += count_nl(s + t, e + 2 - t);
            L.pos = e + 2;
            if (esg == '-')
                while (L.pos < m && is_ws(s[L.pos])) {
                    if (s[L.pos] == '\n') L.line++;
                    L.pos++;
                }
            else if (esg != '+' && L.pos < m && s[L.pos] == '\n') {
                L.pos++;
                L.line++;
            }
            line_starting = L.pos > 0 && s[L.pos - 1] == '\n';
            continue;
        }
        push(&L, kind == '%' ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, L.line, s + t, body - t);
        L.pos = body;
        lex_tag(&L, kind, &line_starting);
    }
    push(&L, TK_EOF, L.line, NULL, 0);
    *out = L.toks;
    *count = L.nt;
}
