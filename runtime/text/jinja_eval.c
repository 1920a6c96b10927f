/* Tree-walking evaluator of the chat-template interpreter (see jinja_eval.h).
 *
 * Expressions evaluate to jv values with CPython semantics for arithmetic (int overflow is an error instead of a
 * big integer), comparison chains, `in`, slicing and truthiness. Statements append to c->out; macro calls and
 * block sets render into a temporary buffer. break/continue set c->ctl, which statement lists check after every
 * statement. A step counter and a nesting limit bound hostile templates. */
#include "runtime/text/jinja_eval.h"
#include "runtime/text/jinja_filters.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_EVAL_DEPTH 1000

static jv undef_named(const char *name)
{
    jv u = jv_undef();
    u.u.s.p = name;
    return u;
}

_Noreturn void jinja_undefined_error(jctx *c, jv u, int line)
{
    if (u.u.s.p)
        jinja_raise(c->err, TSR_ERR_FORMAT, line, "%s", u.u.s.p);
    jinja_raise(c->err, TSR_ERR_FORMAT, line, "undefined value used");
}

static char *fmt_msg(jctx *c, const char *fmt, const char *a1, const char *a2)
{
    size_t n = strlen(fmt) + strlen(a1) + (a2 ? strlen(a2) : 0) + 1;
    char *s = ja_alloc(c->a, n);
    snprintf(s, n, fmt, a1, a2 ? a2 : "");
    return s;
}

static void step(jctx *c, int line)
{
    if (++c->steps > c->max_steps && c->max_steps)
        jinja_raise(c->err, TSR_ERR_NOMEM, line, "template exceeded its evaluation step limit (%llu)",
                    (unsigned long long)c->max_steps);
}

/* ---- scopes ---- */

static jscope *scope_new(jctx *c, jscope *parent)
{
    jscope *s = ja_alloc(c->a, sizeof *s);
    s->parent = parent;
    s->vars = jv_dict_new(c->a, 0);
    return s;
}

static void scope_set(jctx *c, const char *name, jv v) { jv_dict_set(c->a, c->cur->vars, jv_cstr(name), v); }

static jv lookup(jctx *c, const char *name)
{
    size_t n = strlen(name);
    for (jscope *s = c->cur; s; s = s->parent) {
        jv *v = jv_dict_find(s->vars, name, n);
        if (v) return *v;
    }
    jv f = {.t = JV_FUNC};
    if (!strcmp(name, "range")) f.u.i = JF_RANGE;
    else if (!strcmp(name, "namespace")) f.u.i = JF_NAMESPACE;
    else if (!strcmp(name, "dict")) f.u.i = JF_DICT;
    else if (!strcmp(name, "raise_exception")) f.u.i = JF_RAISE;
    else if (!strcmp(name, "strftime_now")) f.u.i = JF_STRFTIME;
    else return undef_named(fmt_msg(c, "'%s' is undefined", name, NULL));
    return f;
}

/* ---- conversions ---- */

jv jinja_str(jctx *c, jv v)
{
    if (v.t == JV_STR) return v;
    jbuf b = {.a = c->a};
    jv_to_str(&b, v);
    return jbuf_value(&b);
}

jv jinja_to_list(jctx *c, jv v, int line)
{
    switch (v.t) {
    case JV_LIST: return v;
    case JV_UNDEF: return jv_list_new(c->a, 0);
    case JV_DICT: {
        jv l = jv_list_new(c->a, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++) l.u.l->v[l.u.l->n++] = v.u.d->k[i];
        return l;
    }
    case JV_STR: {
        jv l = jv_list_new(c->a, v.u.s.n);
        size_t i = 0;
        while (i < v.u.s.n) {
            uint32_t cp;
            size_t nx = utf8_next(v.u.s.p, v.u.s.n, i, &cp);
            l.u.l->v[l.u.l->n++] = jv_str(v.u.s.p + i, nx - i);
            i = nx;
        }
        return l;
    }
    default:
        jinja_raise(c->err, TSR_ERR_FORMAT, line, "'%s' object is not iterable", jv_type_name(v));
    }
}

int jinja_compare(jctx *c, jv a, jv b, int line)
{
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) return a.u.i < b.u.i ? -1 : a.u.i > b.u.i;
        double x = jv_num(a), y = jv_num(b);
        return x < y ? -1 : x > y;
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int r = memcmp(a.u.s.p, b.u.s.p, n);
        if (r) return r < 0 ? -1 : 1;
        return a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n;
    }
    if (a.t == JV_LIST && b.t == JV_LIST) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (jv_equal(a.u.l->v[i], b.u.l->v[i])) continue;
            return jinja_compare(c, a.u.l->v[i], b.u.l->v[i], line);
        }
        return a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
    }
    if (a.t == JV_UNDEF) jinja_undefined_error(c, a, line);
    if (b.t == JV_UNDEF) jinja_undefined_error(c, b, line);
    jinja_raise(c->err, TSR_ERR_FORMAT, line, "'<' not supported between instances of '%s' and '%s'", jv_type_name(a),
                jv_type_name(b));
}

/* ---- attribute and item access ---- */

static jv loop_attr(jctx *c, jloop *L, const char *name, int line)
{
    int64_t len = (int64_t)L->items.u.l->n, i0 = (int64_t)L->index0;
    if (!strcmp(name, "index")) return jv_int(i0 + 1);
    if (!strcmp(name, "index0")) return jv_int(i0);
    if (!strcmp(name, "revindex")) return jv_int(len - i0);
    if (!strcmp(name, "revindex0")) return jv_int(len - i0 - 1);
    if (!strcmp(name, "first")) return jv_bool(i0 == 0);
    if (!strcmp(name, "last")) return jv_bool(i0 == len - 1);
    if (!strcmp(name, "length")) return jv_int(len);
    if (!strcmp(name, "depth")) return jv_int(1);
    if (!strcmp(name, "depth0")) return jv_int(0);
    if (!strcmp(name, "previtem"))
        return i0 > 0 ? L->items.u.l->v[i0 - 1] : undef_named("there is no previous item");
    if (!strcmp(name, "nextitem"))
        return i0 + 1 < len ? L->items.u.l->v[i0 + 1] : undef_named("there is no next item");
    if (!strcmp(name, "changed"))
        jinja_raise(c->err, TSR_ERR_UNSUPPORTED, line, "unsupported construct: loop.changed");
    return undef_named(fmt_msg(c, "'LoopContext object' has no attribute '%s'", name, NULL));
}

jv jinja_getattr(jctx *c, jv obj, const char *name, int line)
{
    switch (obj.t) {
    case JV_UNDEF: jinja_undefined_error(c, obj, line);
    case JV_DICT:
    case JV_NS: {
        jv *v = jv_dict_find(obj, name, strlen(name));
        if (v) return *v;
        return undef_named(
            fmt_msg(c, "'%s object' has no attribute '%s'", obj.t == JV_NS ? "Namespace" : "dict", name));
    }
    case JV_LOOP: return loop_attr(c, obj.u.ptr, name, line);
    default:
        return undef_named(fmt_msg(c, "'%s object' has no attribute '%s'", jv_type_name(obj), name));
    }
}

static int64_t norm_index(int64_t i, size_t n) { return i < 0 ? i + (int64_t)n : i; }

jv jinja_getitem(jctx *c, jv obj, jv key, int line)
{
    switch (obj.t) {
    case JV_UNDEF: jinja_undefined_error(c, obj, line);
    case JV_DICT:
    case JV_NS: {
        jv *v = jv_dict_find_v(obj, key);
        if (v) return *v;
        break;
    }
    case JV_LIST:
        if (key.t == JV_INT || key.t == JV_BOOL) {
            int64_t i = norm_index(key.u.i, obj.u.l->n);
            if (i >= 0 && (size_t)i < obj.u.l->n) return obj.u.l->v[i];
        }
        break;
    case JV_STR:
        if (key.t == JV_INT || key.t == JV_BOOL) {
            size_t len = utf8_len(obj.u.s.p, obj.u.s.n);
            int64_t i = norm_index(key.u.i, len);
            if (i >= 0 && (size_t)i < len) {
                size_t pos = 0;
                uint32_t cp;
                for (int64_t k = 0; k < i; k++) pos = utf8_next(obj.u.s.p, obj.u.s.n, pos, &cp);
                size_t nx = utf8_next(obj.u.s.p, obj.u.s.n, pos, &cp);
                return jv_str(obj.u.s.p + pos, nx - pos);
            }
        }
        break;
    case JV_LOOP:
        if (key.t == JV_STR) return loop_attr(c, obj.u.ptr, ja_strdup(c->a, key.u.s.p, key.u.s.n), line);
        break;
    default: break;
    }
    if (key.t == JV_STR && obj.t != JV_DICT && obj.t != JV_NS)
        return jinja_getattr(c, obj, ja_strdup(c->a, key.u.s.p, key.u.s.n), line);
    jbuf b = {.a = c->a};
    jbuf_printf(&b, "'%s object' has no item ", jv_type_name(obj));
    jv_repr(&b, key);
    return undef_named(b.p);
}

/* Python slice.indices() */
static void slice_indices(int64_t len, jv *start, jv *stop, jv *stepv, int64_t *s0, int64_t *s1, int64_t *st,
                          jctx *c, int line)
{
    int64_t step_ = 1;
    if (stepv && stepv->t != JV_NONE) {
        if (stepv->t != JV_INT && stepv->t != JV_BOOL)
            jinja_raise(c->err, TSR_ERR_FORMAT, line, "slice indices must be integers or None");
        step_ = stepv->u.i;
        if (step_ == 0) jinja_raise(c->err, TSR_ERR_FORMAT, line, "slice step cannot be zero");
    }
    int64_t lo, hi;
    if (step_ < 0) {
        lo = -1;
        hi = len - 1;
    } else {
        lo = 0;
        hi = len;
    }
    int64_t vals[2];
    jv *parts[2] = {start, stop};
    for (int k = 0; k < 2; k++) {
        jv *p = parts[k];
        if (!p || p->t == JV_NONE) {
            vals[k] = (k == 0) == (step_ > 0) ? lo : hi;
            continue;
        }
        if (p->t != JV_INT && p->t != JV_BOOL)
            jinja_raise(c->err, TSR_ERR_FORMAT, line, "slice indices must be integers or None");
        int64_t v = p->u.i;
        if (v < 0) {
            v += len;
            if (v < lo) v = lo;
        } else if (v > hi)
            v = hi;
        vals[k] = v;
    }
    *s0 = vals[0];
    *s1 = vals[1];
    *st = step_;
}

static jv do_slice(jctx *c, jv obj, jv *start, jv *stop, jv *stepv, int line)
{
    if (obj.t == JV_UNDEF) jinja_undefined_error(c, obj, line);
    if (obj.t == JV_LIST) {
        int64_t a, b, s;
        slice_indices((int64_t)obj.u.l->n, start, stop, stepv, &a, &b, &s, c, line);
        jv out = jv_list_new(c->a, 0);
        out.u.l->tuple = obj.u.l->tuple;
        for (int64_t i = a; s > 0 ? i < b : i > b; i += s) jv_list_push(c->a, out, obj.u.l->v[i]);
        return out;
    }
    if (obj.t == JV_STR) {
        size_t len = utf8_len(obj.u.s.p, obj.u.s.n);
        size_t *off = ja_alloc(c->a, (len + 1) * sizeof *off);
        size_t pos = 0, k = 0;
        uint32_t cp;
        while (pos < obj.u.s.n) {
            off[k++] = pos;
            pos = utf8_next(obj.u.s.p, obj.u.s.n, pos, &cp);
        }
        off[len] = obj.u.s.n;
        int64_t a, b, s;
        slice_indices((int64_t)len, start, stop, stepv, &a, &b, &s, c, line);
        if (s == 1) return a < b ? jv_str(obj.u.s.p + off[a], off[b] - off[a]) : jv_str("", 0);
        jbuf out = {.a = c->a};
        for (int64_t i = a; s > 0 ? i < b : i > b; i += s) jbuf_put(&out, obj.u.s.p + off[i], off[i + 1] - off[i]);
        return out.p ? jbuf_value(&out) : jv_str("", 0);
    }
    jinja_raise(c->err, TSR_ERR_FORMAT, line, "'%s' object is not subscriptable", jv_type_name(obj));
}

/* ---- operators ---- */

static _Noreturn void bad_operands(jctx *c, const char *op, jv a, jv b, int line)
{
    if (a.t == JV_UNDEF) jinja_undefined_error(c, a, line);
    if (b.t == JV_UNDEF) jinja_undefined_error(c, b, line);
    jinja_raise(c->err, TSR_ERR_FORMAT, line, "unsupported operand type(s) for %s: '%s' and '%s'", op, jv_type_name(a),
                jv_type_name(b));
}

static jv repeat(jctx *c, jv seq, int64_t n, int line)
{
    if (n < 0) n = 0;
    if (seq.t == JV_STR) {
        if (seq.u.s.n && (uint64_t)n > (c->a->limit ? c->a->limit : (size_t)1 << 40) / seq.u.s.n)
            jinja_raise(c->err, TSR_ERR_NOMEM, line, "string repetition too large");
        jbuf b = {.a = c->a};
        for (int64_t i = 0; i < n; i++) jbuf_put(&b, seq.u.s.p, seq.u.s.n);
        return b.p ? jbuf_value(&b) : jv_str("", 0);
    }
    jv out = jv_list_new(c->a, 0);
    if (seq.u.l->n && (uint64_t)n > ((size_t)1 << 26) / seq.u.l->n)
        jinja_raise(c->err, TSR_ERR_NOMEM, line, "list repetition too large");
    for (int64_t i = 0; i < n; i++)
        for (size_t k = 0; k < seq.u.l->n; k++) jv_list_push(c->a, out, seq.u.l->v[k]);
    return out;
}

static jv binop(jctx *c, int op, jv a, jv b, int line)
{
    int ints = (a.t == JV_INT || a.t == JV_BOOL) && (b.t == JV_INT || b.t == JV_BOOL);
    int nums = jv_is_number(a) && jv_is_number(b);
    int64_t r;
    switch (op) {
    case '~': {
        jv x = jinja_str(c, a), y = jinja_str(c, b);
        jbuf s = {.a = c->a};
        jbuf_put(&s, x.u.s.p, x.u.s.n);
        jbuf_put(&s, y.u.s.p, y.u.s.n);
        return s.p ? jbuf_value(&s) : jv_str("", 0);
    }
    case '+':
        if (ints) {
            if (__builtin_add_overflow(a.u.i, b.u.i, &r)) break;
            return jv_int(r);
        }
        if (nums) return jv_float(jv_num(a) + jv_num(b));
        if (a.t == JV_STR && b.t == JV_STR) {
            jbuf s = {.a = c->a};
            jbuf_put(&s, a.u.s.p, a.u.s.n);
            jbuf_put(&s, b.u.s.p, b.u.s.n);
            return s.p ? jbuf_value(&s) : jv_str("", 0);
        }
        if (a.t == JV_LIST && b.t == JV_LIST) {
            jv l = jv_list_new(c->a, a.u.l->n + b.u.l->n);
            for (size_t i = 0; i < a.u.l->n; i++) l.u.l->v[l.u.l->n++] = a.u.l->v[i];
            for (size_t i = 0; i < b.u.l->n; i++) l.u.l->v[l.u.l->n++] = b.u.l->v[i];
            l.u.l->tuple = a.u.l->tuple;
            return l;
        }
        bad_operands(c, "+", a, b, line);
    case '-':
        if (ints) {
            if (__builtin_sub_overflow(a.u.i, b.u.i, &r)) break;
            return jv_int(r);
        }
        if (nums) return jv_float(jv_num(a) - jv_num(b));
        bad_operands(c, "-", a, b, line);
    case '*':
        if (ints) {
            if (__builtin_mul_overflow(a.u.i, b.u.i, &r)) break;
            return jv_int(r);
        }
        if (nums) return jv_float(jv_num(a) * jv_num(b));
        if ((a.t == JV_STR || a.t == JV_LIST) && (b.t == JV_INT || b.t == JV_BOOL)) return repeat(c, a, b.u.i, line);
        if ((b.t == JV_STR || b.t == JV_LIST) && (a.t == JV_INT || a.t == JV_BOOL)) return repeat(c, b, a.u.i, line);
        bad_operands(c, "*", a, b, line);
    case '/':
        if (!nums) bad_operands(c, "/", a, b, line);
        if (jv_num(b) == 0.0) jinja_raise(c->err, TSR_ERR_FORMAT, line, "division by zero");
        return jv_float(jv_num(a) / jv_num(b));
    case 'F':
    case '%':
        if (op == '%' && a.t == JV_STR)
            jinja_raise(c->err, TSR_ERR_UNSUPPORTED, line,
                        "unsupported construct: printf-style string formatting (%%)");
        if (!nums) bad_operands(c, op == 'F' ? "//" : "%", a, b, line);
        if (ints) {
            if (b.u.i == 0) jinja_raise(c->err, TSR_ERR_FORMAT, line, "integer division or modulo by zero");
            if (a.u.i == INT64_MIN && b.u.i == -1) break;
            int64_t q = a.u.i / b.u.i, m = a.u.i % b.u.i;
            if (m != 0 && ((m < 0) != (b.u.i < 0))) {
                q--;
                m += b.u.i;
            }
            return jv_int(op == 'F' ? q : m);
        } else {
            double x = jv_num(a), y = jv_num(b);
            if (y == 0.0) jinja_raise(c->err, TSR_ERR_FORMAT, line, "float division or modulo by zero");
            double m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            if (op == '%') return jv_float(m);
            return jv_float(floor(x / y));
        }
    case 'P':
        if (ints && b.u.i >= 0) {
            int64_t base = a.u.i, e = b.u.i, acc = 1;
            while (e > 0) {
                if (e & 1)
                    if (__builtin_mul_overflow(acc, base, &acc)) goto overflow;
                e >>= 1;
                if (e && __builtin_mul_overflow(base, base, &base)) goto overflow;
            }
            return jv_int(acc);
        }
        if (nums) return jv_float(pow(jv_num(a), jv_num(b)));
        bad_operands(c, "**", a, b, line);
    }
overflow:
    jinja_raise(c->err, TSR_ERR_UNSUPPORTED, line, "integer overflow (values beyond 64 bits are not supported)");
}

static int contains(jctx *c, jv hay, jv needle, int line)
{
    switch (hay.t) {
    case JV_STR:
        if (needle.t != JV_STR) {
            if (needle.t == JV_UNDEF) jinja_undefined_error(c, needle, line);
            jinja_raise(c->err, TSR_ERR_FORMAT, line, "'in <string>' requires string as left operand, not %s",
                        jv_type_name(needle));
        }
        if (needle.u.s.n == 0) return 1;
        if (needle.u.s.n > hay.u.s.n) return 0;
        return memmem(hay.u.s.p, hay.u.s.n, needle.u.s.p, needle.u.s.n) != NULL;
    case JV_LIST:
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (jv_equal(hay.u.l->v[i], needle)) return 1;
        return 0;
    case JV_DICT: return jv_dict_find_v(hay, needle) != NULL;
    case JV_UNDEF: return 0;
    default:
        jinja_raise(c->err, TSR_ERR_FORMAT, line, "argument of type '%s' is not iterable", jv_type_name(hay));
    }
}

static int compare_op(jctx *c, int op, jv a, jv b, int line)
{
    switch (op) {
    case 'e': return jv_equal(a, b);
    case 'n': return !jv_equal(a, b);
    case 'i': return contains(c, b, a, line);
    case 'I': return !contains(c, b, a, line);
    default: {
        int r = jinja_compare(c, a, b, line);
        return op == '<' ? r < 0 : op == '>' ? r > 0 : op == 'l' ? r <= 0 : r >= 0;
    }
    }
}

/* ---- calls ---- */

static jv call_macro(jctx *c, jinja_macro *m, jv *args, size_t nargs, const char **kwn, jv *kwv, size_t nkw, int line)
{
    const jnode *def = m->node;
    if (nargs > def->args.n)
        jinja_raise(c->err, TSR_ERR_FORMAT, line, "macro '%s' takes not more than %zu argument(s)", def->name,
                    def->args.n);
    if (++c->depth > 100) jinja_raise(c->err, TSR_ERR_UNSUPPORTED, line, "macro calls nested too deeply");
    jscope *saved = c->cur;
    jbuf *saved_out = c->out;
    jscope *s = scope_new(c, m->closure);
    c->cur = s;
    for (size_t k = 0; k < nkw; k++) {
        size_t i;
        for (i = 0; i < def->args.n; i++)
            if (!strcmp(def->args.v[i]->name, kwn[k])) break;
        if (i == def->args.n)
            jinja_raise(c->err, TSR_ERR_FORMAT, line, "macro '%s' takes no keyword argument '%s'", def->name, kwn[k]);
        if (i < nargs)
            jinja_raise(c->err, TSR_ERR_FORMAT, line, "macro '%s' got multiple values for argument '%s'", def->name,
                        kwn[k]);
    }
    for (size_t i = 0; i < def->args.n; i++) {
        const char *pn = def->args.v[i]->name;
        jv v;
        int have = 0;
        if (i < nargs) {
            v = args[i];
            have = 1;
        } else
            for (size_t k = 0; k < nkw; k++)
                if (!strcmp(kwn[k], pn)) {
                    v = kwv[k];
                    have = 1;
                }
        if (!have) {
            if (def->kwargs.v[i])
                v = jinja_eval(c, def->kwargs.v[i]);
            else
                v = undef_named(fmt_msg(c, "parameter '%s' was not provided", pn, NULL));
        }
        scope_set(c, pn, v);
    }
    jbuf out = {.a = c->a};
    c->out = &out;
    jinja_exec(c, &def->body);
    c->ctl = 0;
    c->out = saved_out;
    c->cur = saved;
    c->depth--;
    return out.p ? jbuf_value(&out) : jv_str("", 0);
}

static jv call_builtin(jctx *c, int id, jv *args, size_t nargs, const char **kwn, jv *kwv, size_t nkw, int line)
{
    switch (id) {
    case JF_RANGE: {
        if (nkw || nargs < 1 || nargs > 3)
            jinja_raise(c->err, TSR_ERR_FORMAT, line, "range() takes 1 to 3 integer arguments");
        int64_t v[3];
        for (size_t i = 0; i < nargs; i++) {
            if (args[i].t != JV_INT && args[i].t != JV_BOOL)
                jinja_raise(c->err, TSR_ERR_FORMAT, line, "range(): '%s' object cannot be interpreted as an integer",
                            jv_type_name(args[i]));
            v[i] = args[i].u.i;
        }
        int64_t start = nargs == 1 ? 0 : v[0], stop = nargs == 1 ? v[0] : v[1], st = nargs == 3 ? v[2] : 1;
        if (st == 0) jinja_raise(c->err, TSR_ERR_FORMAT, line, "range() arg 3 must not be zero");
        double count = st > 0 ? ceil(((double)stop - (double)start) / (double)st)
                              : ceil(((double)start - (double)stop) / (double)-st);
        if (count < 0) count = 0;
        if (count > 100000)
            jinja_raise(c->err, TSR_ERR_FORMAT, line,
                        "range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        jv l = jv_list_new(c->a, (size_t)count);
        for (size_t i = 0; i < (size_t)count; i++) l.u.l->v[l.u.l->n++] = jv_int(start + (int64_t)i * st);
        return l;
    }
    case JF_NAMESPACE:
    case JF_DICT: {
        jv d = jv_dict_new(c->a, 0);
        if (nargs > 1) jinja_raise(c->err, TSR_ERR_FORMAT, line, "%s() takes at most 1 positional argument",
                                   id == JF_DICT ? "dict" : "namespace");
        if (nargs == 1) {
            if (args[0].t == JV_DICT || args[0].t == JV_NS) {
                for (size_t i = 0; i < args[0].u.d->n; i++) jv_dict_set(c->a, d, args[0].u.d->k[i], args[0].u.d->v[i]);
            } else if (args[0].t == JV_LIST) {
                for (size_t i = 0; i < args[0].u.l->n; i++) {
                    jv p = args[0].u.l->v[i];
                    if (p.t != JV_LIST || p.u.l->n != 2)
                        jinja_raise(c->err, TSR_ERR_FORMAT, line,
                                    "dictionary update sequence element has wrong length");
                    jv_dict_set(c->a, d, p.u.l->v[0], p.u.l->v[1]);
                }
            } else
                jinja_raise(c->err, TSR_ERR_FORMAT, line, "'%s' object is not a mapping", jv_type_name(args[0]));
        }
        for (size_t k = 0; k < nkw; k++) jv_dict_set(c->a, d, jv_cstr(kwn[k]), kwv[k]);
        if (id == JF_NAMESPACE) {
            for (size_t i = 0; i < d.u.d->n; i++)
                if (d.u.d->k[i].t == JV_STR && d.u.d->k[i].u.s.n && d.u.d->k[i].u.s.p[0] == '_')
                    jinja_raise(c->err, TSR_ERR_FORMAT, line,
                                "chat templates cannot store underscore-prefixed attributes on a namespace");
            d.t = JV_NS;
        }
        return d;
    }
    case JF_RAISE: {
        jv msg = nargs ? jinja_str(c, args[0]) : jv_str("", 0);
        jinja_raise(c->err, TSR_ERR_ARG, line, "raise_exception: %.*s", (int)(msg.u.s.n > 600 ? 600 : msg.u.s.n),
                    msg.u.s.p);
    }
    case JF_STRFTIME: {
        if (nargs != 1 || args[0].t != JV_STR)
            jinja_raise(c->err, TSR_ERR_FORMAT, line, "strftime_now() takes one string argument");
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        char fmtbuf[256], out[512];
        size_t n = args[0].u.s.n < sizeof fmtbuf - 1 ? args[0].u.s.n : sizeof fmtbuf - 1;
        memcpy(fmtbuf, args[0].u.s.p, n);
        fmtbuf[n] = '\0';
        size_t len = strftime(out, sizeof out, fmtbuf, &tmv);
        return jv_str(ja_strdup(c->a, out, len), len);
    }
    }
    jinja_raise(c->err, TSR_ERR_INTERNAL, line, "unknown builtin");
}

jv jinja_call_value(jctx *c, jv fn, jv *args, size_t nargs, const char **kwn, jv *kwv, size_t nkw, int line)
{
    if (fn.t == JV_MACRO) return call_macro(c, fn.u.ptr, args, nargs, kwn, kwv, nkw, line);
    if (fn.t == JV_FUNC) return call_builtin(c, (int)fn.u.i, args, nargs, kwn, kwv, nkw, line);
    if (fn.t == JV_UNDEF) jinja_undefined_error(c, fn, line);
    jinja_raise(c->err, TSR_ERR_FORMAT, line, "'%s' object is not callable", jv_type_name(fn));
}

static void eval_args(jctx *c, const jnode *e, jv **args, jv **kwv)
{
    *args = e->args.n ? ja_alloc(c->a, e->args.n * sizeof(jv)) : NULL;
    *kwv = e->kwargs.n ? ja_alloc(c->a, e->kwargs.n * sizeof(jv)) : NULL;
    for (size_t i = 0; i < e->args.n; i++) (*args)[i] = jinja_eval(c, e->args.v[i]);
    for (size_t i = 0; i < e->kwargs.n; i++) (*kwv)[i] = jinja_eval(c, e->kwargs.v[i]);
}

static jv eval_call(jctx *c, const jnode *e)
{
    jv *args, *kwv;
    if (e->a->kind == N_ATTR) {
        jv obj = jinja_eval(c, e->a->a);
        if (obj.t == JV_UNDEF) jinja_undefined_error(c, obj, e->line);
        jv attr = jv_undef();
        if (obj.t == JV_DICT || obj.t == JV_NS) { /* a stored callable (macro in a dict/namespace) wins */
            jv *v = jv_dict_find(obj, e->a->name, strlen(e->a->name));
            if (v && (v->t == JV_MACRO || v->t == JV_FUNC)) attr = *v;
        }
        eval_args(c, e, &args, &kwv);
        if (attr.t != JV_UNDEF)
            return jinja_call_value(c, attr, args, e->args.n, e->kwnames, kwv, e->kwargs.n, e->line);
        int handled = 1;
        jv r = jinja_call_method(c, obj, e->a->name, args, e->args.n, e->kwnames, kwv, e->kwargs.n, e->line, &handled);
        if (handled) return r;
        jinja_raise(c->err, TSR_ERR_UNSUPPORTED, e->line, "unsupported construct: method '%s' of a '%s' value",
                    e->a->name, jv_type_name(obj));
    }
    jv fn = jinja_eval(c, e->a);
    eval_args(c, e, &args, &kwv);
    return jinja_call_value(c, fn, args, e->args.n, e->kwnames, kwv, e->kwargs.n, e->line);
}

/* ---- expressions ---- */

static jv eval_inner(jctx *c, const jnode *e)
{
    switch (e->kind) {
    case N_CONST: return e->cval;
    case N_NAME: return lookup(c, e->name);
    case N_ATTR: return jinja_getattr(c, jinja_eval(c, e->a), e->name, e->line);
    case N_ITEM: {
        jv o = jinja_eval(c, e->a);
        return jinja_getitem(c, o, jinja_eval(c, e->b), e->line);
    }
    case N_SLICE: {
        jv o = jinja_eval(c, e->a);
        jv parts[3];
        const jnode *pn[3] = {e->b, e->c, e->d};
        for (int i = 0; i < 3; i++) parts[i] = pn[i] ? jinja_eval(c, pn[i]) : jv_none();
        return do_slice(c, o, &parts[0], &parts[1], &parts[2], e->line);
    }
    case N_CALL: return eval_call(c, e);
    case N_FILTER: {
        jv v = jinja_eval(c, e->a);
        jv *args, *kwv;
        eval_args(c, e, &args, &kwv);
        return jinja_apply_filter(c, e->name, v, args, e->args.n, e->kwnames, kwv, e->kwargs.n, e->line);
    }
    case N_TEST: {
        jv v = jinja_eval(c, e->a);
        jv *args, *kwv;
        eval_args(c, e, &args, &kwv);
        int r = jinja_apply_test(c, e->name, v, args, e->args.n, e->line);
        return jv_bool(e->op ? !r : r);
    }
    case N_BIN: {
        jv a = jinja_eval(c, e->a);
        jv b = jinja_eval(c, e->b);
        return binop(c, e->op, a, b, e->line);
    }
    case N_CMP: {
        jv left = jinja_eval(c, e->a);
        for (size_t i = 0; i < e->args.n; i++) {
            jv right = jinja_eval(c, e->args.v[i]);
            if (!compare_op(c, e->ops[i], left, right, e->line)) return jv_bool(0);
            left = right;
        }
        return jv_bool(1);
    }
    case N_AND: {
        jv a = jinja_eval(c, e->a);
        return jv_truthy(a) ? jinja_eval(c, e->b) : a;
    }
    case N_OR: {
        jv a = jinja_eval(c, e->a);
        return jv_truthy(a) ? a : jinja_eval(c, e->b);
    }
    case N_NOT: return jv_bool(!jv_truthy(jinja_eval(c, e->a)));
    case N_NEG:
    case N_POS: {
        jv a = jinja_eval(c, e->a);
        if (a.t == JV_FLOAT) return jv_float(e->kind == N_NEG ? -a.u.f : a.u.f);
        if (a.t == JV_INT || a.t == JV_BOOL) {
            if (e->kind == N_POS) return jv_int(a.u.i);
            if (a.u.i == INT64_MIN) jinja_raise(c->err, TSR_ERR_UNSUPPORTED, e->line, "integer overflow");
            return jv_int(-a.u.i);
        }
        if (a.t == JV_UNDEF) jinja_undefined_error(c, a, e->line);
        jinja_raise(c->err, TSR_ERR_FORMAT, e->line, "bad operand type for unary %c: '%s'",
                    e->kind == N_NEG ? '-' : '+', jv_type_name(a));
    }
    case N_COND:
        if (jv_truthy(jinja_eval(c, e->a))) return jinja_eval(c, e->b);
        return e->c ? jinja_eval(c, e->c)
                    : undef_named("the inline if-expression evaluated to false and no else section was defined");
    case N_LIST:
    case N_TUPLE: {
        jv l = jv_list_new(c->a, e->args.n);
        for (size_t i = 0; i < e->args.n; i++) l.u.l->v[l.u.l->n++] = jinja_eval(c, e->args.v[i]);
        l.u.l->tuple = e->kind == N_TUPLE;
        return l;
    }
    case N_DICT: {
        jv d = jv_dict_new(c->a, e->args.n);
        for (size_t i = 0; i < e->args.n; i++) {
            jv k = jinja_eval(c, e->args.v[i]);
            if (k.t == JV_LIST || k.t == JV_DICT || k.t == JV_NS)
                jinja_raise(c->err, TSR_ERR_FORMAT, e->line, "unhashable type: '%s'", jv_type_name(k));
            jv_dict_set(c->a, d, k, jinja_eval(c, e->kwargs.v[i]));
        }
        return d;
    }
    default: jinja_raise(c->err, TSR_ERR_INTERNAL, e->line, "statement used as an expression");
    }
}

jv jinja_eval(jctx *c, const jnode *e)
{
    step(c, e->line);
    if (++c->depth > MAX_EVAL_DEPTH) jinja_raise(c->err, TSR_ERR_UNSUPPORTED, e->line, "expression nested too deeply");
    jv v = eval_inner(c, e);
    c->depth--;
    return v;
}

/* ---- statements ---- */

static void assign(jctx *c, const jnode *target, jv v, int line)
{
    if (target->kind == N_NAME) {
        scope_set(c, target->name, v);
        return;
    }
    if (target->kind == N_ATTR) {
        jv ns = lookup(c, target->a->name);
        if (ns.t != JV_NS)
            jinja_raise(c->err, TSR_ERR_FORMAT, line, "cannot assign attribute on non-namespace object '%s'",
                        target->a->name);
        if (target->name[0] == '_')
            jinja_raise(c->err, TSR_ERR_FORMAT, line,
                        "chat templates cannot store underscore-prefixed attributes on a namespace");
        jv_dict_set(c->a, ns, jv_cstr(target->name), v);
        return;
    }
    /* tuple unpacking */
    jv l = v.t == JV_LIST ? v : jinja_to_list(c, v, line);
    if (l.u.l->n != target->args.n)
        jinja_raise(c->err, TSR_ERR_FORMAT, line, "cannot unpack %zu value(s) into %zu target(s)", l.u.l->n,
                    target->args.n);
    for (size_t i = 0; i < target->args.n; i++) assign(c, target->args.v[i], l.u.l->v[i], line);
}

static jv capture(jctx *c, const jnodes *body)
{
    jbuf *saved = c->out;
    jbuf out = {.a = c->a};
    c->out = &out;
    jinja_exec(c, body);
    c->out = saved;
    return out.p ? jbuf_value(&out) : jv_str("", 0);
}

static void exec_for(jctx *c, const jnode *s)
{
    jv it = jinja_eval(c, s->b);
    if (it.t == JV_NONE || it.t == JV_INT || it.t == JV_FLOAT || it.t == JV_BOOL || it.t == JV_NS ||
        it.t == JV_MACRO || it.t == JV_FUNC || it.t == JV_LOOP)
        jinja_raise(c->err, TSR_ERR_FORMAT, s->line, "'%s' object is not iterable", jv_type_name(it));
    jv items = jinja_to_list(c, it, s->line);
    jscope *outer = c->cur;
    if (s->c) { /* loop filter: evaluated with only the target bound */
        jv kept = jv_list_new(c->a, 0);
        for (size_t i = 0; i < items.u.l->n; i++) {
            c->cur = scope_new(c, outer);
            assign(c, s->a, items.u.l->v[i], s->line);
            if (jv_truthy(jinja_eval(c, s->c))) jv_list_push(c->a, kept, items.u.l->v[i]);
        }
        c->cur = outer;
        items = kept;
    }
    jloop *L = ja_alloc(c->a, sizeof *L);
    L->items = items;
    jv loopv = {.t = JV_LOOP};
    loopv.u.ptr = L;
    size_t n = items.u.l->n;
    for (size_t i = 0; i < n; i++) {
        step(c, s->line);
        L->index0 = i;
        c->cur = scope_new(c, outer);
        scope_set(c, "loop", loopv);
        assign(c, s->a, items.u.l->v[i], s->line);
        jinja_exec(c, &s->body);
        c->cur = outer;
        if (c->ctl == 1) {
            c->ctl = 0;
            break;
        }
        c->ctl = 0;
    }
    if (n == 0) jinja_exec(c, &s->orelse);
}

static void exec_stmt(jctx *c, const jnode *s)
{
    step(c, s->line);
    switch (s->kind) {
    case S_DATA: jbuf_put(c->out, s->cval.u.s.p, s->cval.u.s.n); return;
    case S_OUTPUT: {
        jv v = jinja_eval(c, s->a);
        jv_to_str(c->out, v);
        return;
    }
    case S_IF:
        if (jv_truthy(jinja_eval(c, s->a)))
            jinja_exec(c, &s->body);
        else
            jinja_exec(c, &s->orelse);
        return;
    case S_FOR: exec_for(c, s); return;
    case S_SET: assign(c, s->a, jinja_eval(c, s->b), s->line); return;
    case S_SETBLOCK: assign(c, s->a, capture(c, &s->body), s->line); return;
    case S_MACRO: {
        jinja_macro *m = ja_alloc(c->a, sizeof *m);
        m->node = s;
        m->closure = c->cur;
        jv v = {.t = JV_MACRO};
        v.u.ptr = m;
        scope_set(c, s->name, v);
        return;
    }
    case S_BREAK: c->ctl = 1; return;
    case S_CONTINUE: c->ctl = 2; return;
    case S_WITH: {
        jv *vals = ja_alloc(c->a, (s->kwargs.n + 1) * sizeof(jv));
        for (size_t i = 0; i < s->kwargs.n; i++) vals[i] = jinja_eval(c, s->kwargs.v[i]);
        jscope *outer = c->cur;
        c->cur = scope_new(c, outer);
        for (size_t i = 0; i < s->args.n; i++) assign(c, s->args.v[i], vals[i], s->line);
        jinja_exec(c, &s->body);
        c->cur = outer;
        return;
    }
    case S_FILTERBLOCK: {
        jv text = capture(c, &s->body);
        /* apply the chain innermost first */
        const jnode *chain[64];
        size_t n = 0;
        for (const jnode *f = s->a; f && n < 64; f = f->a) chain[n++] = f;
        jv v = text;
        while (n--) {
            const jnode *f = chain[n];
            jv *args, *kwv;
            eval_args(c, f, &args, &kwv);
            v = jinja_apply_filter(c, f->name, v, args, f->args.n, f->kwnames, kwv, f->kwargs.n, f->line);
        }
        jv_to_str(c->out, v);
        return;
    }
    case S_GENERATION: jinja_exec(c, &s->body); return;
    default: jinja_raise(c->err, TSR_ERR_INTERNAL, s->line, "expression used as a statement");
    }
}

void jinja_exec(jctx *c, const jnodes *body)
{
    if (++c->depth > MAX_EVAL_DEPTH) jinja_raise(c->err, TSR_ERR_UNSUPPORTED, 0, "template nested too deeply");
    for (size_t i = 0; i < body->n; i++) {
        exec_stmt(c, body->v[i]);
        if (c->ctl) break;
    }
    c->depth--;
}
