/* Parser of the chat-template interpreter: tokens to the syntax tree of jinja_ast.h.
 *
 * A recursive-descent copy of Jinja2's parser.py for the supported subset. Each statement parser consumes its
 * own "{% ... %}" tags; bodies are parsed by subparse() until one of the expected end tags. Filters and tests are
 * checked against the implemented set here so that unknown names fail at parse time, as in Jinja. */
#include "runtime/text/jinja_ast.h"
#include "runtime/text/jinja_filters.h"

#include <string.h>

typedef struct {
    jinja_arena *a;
    jtoken *t;
    size_t n, pos;
    int loop_depth;
    int macro_depth;
    int depth;
} parser;

static void enter(parser *P);

static jtoken *cur(parser *P) { return &P->t[P->pos]; }
static jtoken *peek(parser *P, size_t k) { return &P->t[P->pos + k < P->n ? P->pos + k : P->n - 1]; }
static void adv(parser *P)
{
    if (P->pos + 1 < P->n) P->pos++;
}

static int is_op(jtoken *t, const char *op) { return t->t == TK_OP && t->n == strlen(op) && !memcmp(t->p, op, t->n); }
static int is_name(jtoken *t, const char *nm)
{
    return t->t == TK_NAME && t->n == strlen(nm) && !memcmp(t->p, nm, t->n);
}

static const char *tok_desc(parser *P, jtoken *t)
{
    switch (t->t) {
    case TK_EOF: return "end of template";
    case TK_DATA: return "template data";
    case TK_VAR_BEGIN: return "'{{'";
    case TK_VAR_END: return "'}}'";
    case TK_BLOCK_BEGIN: return "'{%'";
    case TK_BLOCK_END: return "'%}'";
    case TK_STRING: return "string literal";
    case TK_INT:
    case TK_FLOAT: return "number";
    default: {
        char *s = ja_alloc(P->a, t->n + 3);
        s[0] = '\'';
        memcpy(s + 1, t->p, t->n > 40 ? 40 : t->n);
        strcat(s, "'");
        return s;
    }
    }
}

static _Noreturn void syntax(parser *P, jtoken *t, const char *what)
{
    jinja_raise(P->a->err, TSR_ERR_FORMAT, t->line, "syntax error: expected %s, got %s", what, tok_desc(P, t));
}

static void expect_op(parser *P, const char *op)
{
    if (!is_op(cur(P), op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        syntax(P, cur(P), w);
    }
    adv(P);
}

static const char *expect_name(parser *P)
{
    jtoken *t = cur(P);
    if (t->t != TK_NAME) syntax(P, t, "a name");
    adv(P);
    return ja_strdup(P->a, t->p, t->n);
}

static void expect_block_end(parser *P)
{
    if (cur(P)->t != TK_BLOCK_END) syntax(P, cur(P), "'%}'");
    adv(P);
}

static jnode *mk(parser *P, jnode_kind k, int line)
{
    jnode *n = ja_alloc(P->a, sizeof *n);
    n->kind = k;
    n->line = line;
    return n;
}

static void push(parser *P, jnodes *l, jnode *n)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        jnode **v = ja_alloc(P->a, cap * sizeof *v);
        if (l->n) memcpy(v, l->v, l->n * sizeof *v);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = n;
}

static void push_kwname(parser *P, jnode *n, const char *name)
{
    /* kwnames grows with kwargs (called right after pushing to kwargs) */
    const char **v = ja_alloc(P->a, n->kwargs.n * sizeof *v);
    if (n->kwargs.n > 1) memcpy(v, n->kwnames, (n->kwargs.n - 1) * sizeof *v);
    v[n->kwargs.n - 1] = name;
    n->kwnames = v;
}

static jnode *parse_expression(parser *P, int with_condexpr);
static jnode *parse_unary(parser *P, int with_filter);
static jnode *parse_primary(parser *P);
static jnode *parse_postfix(parser *P, jnode *node);
static jnode *parse_filter_expr(parser *P, jnode *node);

/* ---- expressions ---- */

static int is_tuple_end(parser *P, const char *extra)
{
    jtoken *t = cur(P);
    if (t->t == TK_VAR_END || t->t == TK_BLOCK_END || t->t == TK_EOF || is_op(t, ")")) return 1;
    if (extra && is_name(t, extra)) return 1;
    return 0;
}

static jnode *parse_tuple(parser *P, int with_condexpr, const char *extra_end, int explicit_parens)
{
    int line = cur(P)->line;
    jnode *tup = mk(P, N_TUPLE, line);
    int is_tuple = 0;
    for (;;) {
        if (tup->args.n) expect_op(P, ",");
        if (is_tuple_end(P, extra_end)) break;
        push(P, &tup->args, parse_expression(P, with_condexpr));
        if (is_op(cur(P), ","))
            is_tuple = 1;
        else
            break;
    }
    if (!is_tuple) {
        if (tup->args.n) return tup->args.v[0];
        if (!explicit_parens) syntax(P, cur(P), "an expression");
    }
    return tup;
}

static jnode *parse_call_args(parser *P, jnode *node)
{
    expect_op(P, "(");
    int seen_kw = 0;
    while (!is_op(cur(P), ")")) {
        if (node->args.n || node->kwargs.n) {
            expect_op(P, ",");
            if (is_op(cur(P), ")")) break;
        }
        if (is_op(cur(P), "*") || is_op(cur(P), "**"))
            jinja_raise(P->a->err, TSR_ERR_UNSUPPORTED, cur(P)->line,
                        "unsupported construct: *args/**kwargs in a call");
        if (cur(P)->t == TK_NAME && is_op(peek(P, 1), "=")) {
            const char *k = expect_name(P);
            adv(P);
            push(P, &node->kwargs, parse_expression(P, 1));
            push_kwname(P, node, k);
            seen_kw = 1;
        } else {
            if (seen_kw)
                jinja_raise(P->a->err, TSR_ERR_FORMAT, cur(P)->line,
                            "syntax error: positional argument after keyword argument");
            push(P, &node->args, parse_expression(P, 1));
        }
    }
    adv(P);
    return node;
}

static const char *dotted_name(parser *P)
{
    const char *nm = expect_name(P);
    while (is_op(cur(P), ".") && peek(P, 1)->t == TK_NAME) {
        adv(P);
        const char *more = expect_name(P);
        size_t l1 = strlen(nm), l2 = strlen(more);
        char *s = ja_alloc(P->a, l1 + l2 + 2);
        memcpy(s, nm, l1);
        s[l1] = '.';
        memcpy(s + l1 + 1, more, l2);
        nm = s;
    }
    return nm;
}

static jnode *parse_filter(parser *P, jnode *node)
{
    int line = cur(P)->line;
    const char *nm = dotted_name(P);
    int k = jinja_filter_known(nm);
    if (k == 0) jinja_raise(P->a->err, TSR_ERR_FORMAT, line, "no filter named '%s'", nm);
    if (k < 0) jinja_raise(P->a->err, TSR_ERR_UNSUPPORTED, line, "unsupported construct: filter '%s'", nm);
    jnode *f = mk(P, N_FILTER, line);
    f->a = node;
    f->name = nm;
    if (is_op(cur(P), "(")) parse_call_args(P, f);
    return f;
}

static jnode *parse_test(parser *P, jnode *node)
{
    int line = cur(P)->line;
    adv(P); /* 'is' */
    int neg = 0;
    if (is_name(cur(P), "not")) {
        neg = 1;
        adv(P);
    }
    const char *nm = dotted_name(P);
    int k = jinja_test_known(nm);
    if (k == 0) jinja_raise(P->a->err, TSR_ERR_FORMAT, line, "no test named '%s'", nm);
    if (k < 0) jinja_raise(P->a->err, TSR_ERR_UNSUPPORTED, line, "unsupported construct: test '%s'", nm);
    jnode *t = mk(P, N_TEST, line);
    t->a = node;
    t->name = nm;
    t->op = neg;
    jtoken *c = cur(P);
    if (is_op(c, "(")) {
        parse_call_args(P, t);
    } else if ((c->t == TK_NAME || c->t == TK_STRING || c->t == TK_INT || c->t == TK_FLOAT || is_op(c, "(") ||
                is_op(c, "[") || is_op(c, "{")) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and") && !is_name(c, "if")) {
        if (is_name(c, "is"))
            jinja_raise(P->a->err, TSR_ERR_FORMAT, c->line, "syntax error: you cannot chain multiple tests with is");
        jnode *arg = parse_postfix(P, parse_primary(P));
        push(P, &t->args, arg);
    }
    return t;
}

static jnode *parse_subscribed(parser *P)
{
    int line = cur(P)->line;
    jnode *parts[3] = {NULL, NULL, NULL};
    if (!is_op(cur(P), ":")) {
        jnode *e = parse_expression(P, 1);
        if (!is_op(cur(P), ":")) return e;
        parts[0] = e;
    }
    adv(P); /* ':' */
    if (!is_op(cur(P), "]") && !is_op(cur(P), ",") && !is_op(cur(P), ":")) parts[1] = parse_expression(P, 1);
    if (is_op(cur(P), ":")) {
        adv(P);
        if (!is_op(cur(P), "]") && !is_op(cur(P), ",")) parts[2] = parse_expression(P, 1);
    }
    jnode *s = mk(P, N_SLICE, line);
    s->b = parts[0];
    s->c = parts[1];
    s->d = parts[2];
    return s;
}

static jnode *parse_postfix(parser *P, jnode *node)
{
    for (;;) {
        jtoken *t = cur(P);
        if (is_op(t, ".")) {
            adv(P);
            jtoken *a = cur(P);
            if (a->t == TK_NAME) {
                jnode *n = mk(P, N_ATTR, a->line);
                n->a = node;
                n->name = expect_name(P);
                node = n;
            } else if (a->t == TK_INT) {
                jnode *n = mk(P, N_ITEM, a->line);
                n->a = node;
                n->b = mk(P, N_CONST, a->line);
                n->b->cval = jv_int(a->i);
                adv(P);
                node = n;
            } else
                syntax(P, a, "a name or number after '.'");
        } else if (is_op(t, "[")) {
            adv(P);
            jnode *sub = parse_subscribed(P);
            if (is_op(cur(P), ","))
                jinja_raise(P->a->err, TSR_ERR_UNSUPPORTED, cur(P)->line, "unsupported construct: tuple subscript");
            expect_op(P, "]");
            if (sub->kind == N_SLICE) {
                sub->a = node;
                node = sub;
            } else {
                jnode *n = mk(P, N_ITEM, t->line);
                n->a = node;
                n->b = sub;
                node = n;
            }
        } else if (is_op(t, "(")) {
            jnode *n = mk(P, N_CALL, t->line);
            n->a = node;
            node = parse_call_args(P, n);
        } else
            return node;
    }
}

static jnode *parse_filter_expr(parser *P, jnode *node)
{
    for (;;) {
        jtoken *t = cur(P);
        if (is_op(t, "|")) {
            adv(P);
            node = parse_filter(P, node);
        } else if (is_name(t, "is")) {
            node = parse_test(P, node);
        } else if (is_op(t, "(")) {
            jnode *n = mk(P, N_CALL, t->line);
            n->a = node;
            node = parse_call_args(P, n);
        } else
            return node;
    }
}

static jnode *parse_primary(parser *P)
{
    jtoken *t = cur(P);
    jnode *n;
    switch (t->t) {
    case TK_NAME:
        n = mk(P, N_CONST, t->line);
        if (is_name(t, "true") || is_name(t, "True"))
            n->cval = jv_bool(1);
        else if (is_name(t, "false") || is_name(t, "False"))
            n->cval = jv_bool(0);
        else if (is_name(t, "none") || is_name(t, "None"))
            n->cval = jv_none();
        else {
            n->kind = N_NAME;
            n->name = ja_strdup(P->a, t->p, t->n);
        }
        adv(P);
        return n;
    case TK_STRING: {
        n = mk(P, N_CONST, t->line);
        size_t total = 0, k = P->pos;
        while (P->t[k].t == TK_STRING) total += P->t[k++].n;
        char *s = ja_alloc(P->a, total + 1);
        size_t o = 0;
        while (cur(P)->t == TK_STRING) {
            memcpy(s + o, cur(P)->p, cur(P)->n);
            o += cur(P)->n;
            adv(P);
        }
        n->cval = jv_str(s, total);
        return n;
    }
    case TK_INT:
        n = mk(P, N_CONST, t->line);
        n->cval = jv_int(t->i);
        adv(P);
        return n;
    case TK_FLOAT:
        n = mk(P, N_CONST, t->line);
        n->cval = jv_float(t->f);
        adv(P);
        return n;
    default: break;
    }
    if (is_op(t, "(")) {
        adv(P);
        n = parse_tuple(P, 1, NULL, 1);
        expect_op(P, ")");
        return n;
    }
    if (is_op(t, "[")) {
        adv(P);
        n = mk(P, N_LIST, t->line);
        while (!is_op(cur(P), "]")) {
            if (n->args.n) expect_op(P, ",");
            if (is_op(cur(P), "]")) break;
            push(P, &n->args, parse_expression(P, 1));
        }
        adv(P);
        return n;
    }
    if (is_op(t, "{")) {
        adv(P);
        n = mk(P, N_DICT, t->line);
        while (!is_op(cur(P), "}")) {
            if (n->args.n) expect_op(P, ",");
            if (is_op(cur(P), "}")) break;
            push(P, &n->args, parse_expression(P, 1));
            expect_op(P, ":");
            push(P, &n->kwargs, parse_expression(P, 1));
        }
        adv(P);
        return n;
    }
    syntax(P, t, "an expression");
}

static jnode *parse_unary(parser *P, int with_filter)
{
    jtoken *t = cur(P);
    jnode *node;
    if (is_op(t, "-") || is_op(t, "+")) {
        adv(P);
        node = mk(P, is_op(t, "-") ? N_NEG : N_POS, t->line);
        enter(P);
        node->a = parse_unary(P, 0);
        P->depth--;
    } else
        node = parse_primary(P);
    node = parse_postfix(P, node);
    if (with_filter) node = parse_filter_expr(P, node);
    return node;
}

static jnode *bin(parser *P, int op, jnode *l, jnode *r, int line)
{
    jnode *n = mk(P, N_BIN, line);
    n->op = op;
    n->a = l;
    n->b = r;
    return n;
}

static jnode *parse_pow(parser *P)
{
    jnode *l = parse_unary(P, 1);
    while (is_op(cur(P), "**")) {
        int line = cur(P)->line;
        adv(P);
        l = bin(P, 'P', l, parse_unary(P, 1), line);
    }
    return l;
}

static jnode *parse_math2(parser *P)
{
    jnode *l = parse_pow(P);
    for (;;) {
        jtoken *t = cur(P);
        int op = is_op(t, "*") ? '*' : is_op(t, "/") ? '/' : is_op(t, "//") ? 'F' : is_op(t, "%") ? '%' : 0;
        if (!op) return l;
        adv(P);
        l = bin(P, op, l, parse_pow(P), t->line);
    }
}

static jnode *parse_concat(parser *P)
{
    jnode *l = parse_math2(P);
    while (is_op(cur(P), "~")) {
        int line = cur(P)->line;
        adv(P);
        l = bin(P, '~', l, parse_math2(P), line);
    }
    return l;
}

static jnode *parse_math1(parser *P)
{
    jnode *l = parse_concat(P);
    for (;;) {
        jtoken *t = cur(P);
        int op = is_op(t, "+") ? '+' : is_op(t, "-") ? '-' : 0;
        if (!op) return l;
        adv(P);
        l = bin(P, op, l, parse_concat(P), t->line);
    }
}

static jnode *parse_compare(parser *P)
{
    int line = cur(P)->line;
    jnode *first = parse_math1(P);
    jnode *cmp = NULL;
    size_t cap = 0;
    for (;;) {
        jtoken *t = cur(P);
        int op = is_op(t, "==") ? 'e' : is_op(t, "!=") ? 'n' : is_op(t, "<") ? '<' : is_op(t, ">") ? '>'
               : is_op(t, "<=") ? 'l' : is_op(t, ">=") ? 'g' : is_name(t, "in") ? 'i' : 0;
        if (!op && is_name(t, "not") && is_name(peek(P, 1), "in")) {
            op = 'I';
            adv(P);
        }
        if (!op) break;
        adv(P);
        if (!cmp) {
            cmp = mk(P, N_CMP, line);
            cmp->a = first;
        }
        push(P, &cmp->args, parse_math1(P));
        if (cmp->args.n > cap) {
            size_t nc = cap ? cap * 2 : 4;
            int *ops = ja_alloc(P->a, nc * sizeof *ops);
            if (cap) memcpy(ops, cmp->ops, cap * sizeof *ops);
            cmp->ops = ops;
            cap = nc;
        }
        cmp->ops[cmp->args.n - 1] = op;
    }
    return cmp ? cmp : first;
}

static jnode *parse_not(parser *P)
{
    if (is_name(cur(P), "not")) {
        jnode *n = mk(P, N_NOT, cur(P)->line);
        adv(P);
        enter(P);
        n->a = parse_not(P);
        P->depth--;
        return n;
    }
    return parse_compare(P);
}

/* A left-associative chain `operand (keyword operand)*` such as `a and b and c`. */
static jnode *parse_keyword_chain(parser *P, const char *keyword, jnode_kind kind, jnode *(*operand)(parser *))
{
    jnode *l = operand(P);
    while (is_name(cur(P), keyword)) {
        jnode *n = mk(P, kind, cur(P)->line);
        adv(P);
        n->a = l;
        n->b = operand(P);
        l = n;
    }
    return l;
}

static jnode *parse_and(parser *P) { return parse_keyword_chain(P, "and", N_AND, parse_not); }

static jnode *parse_or(parser *P) { return parse_keyword_chain(P, "or", N_OR, parse_and); }

static jnode *parse_condexpr(parser *P)
{
    jnode *e1 = parse_or(P);
    while (is_name(cur(P), "if")) {
        jnode *n = mk(P, N_COND, cur(P)->line);
        adv(P);
        n->a = parse_or(P);
        n->b = e1;
        if (is_name(cur(P), "else")) {
            adv(P);
            n->c = parse_condexpr(P);
        }
        e1 = n;
    }
    return e1;
}

static void enter(parser *P)
{
    if (++P->depth > 200)
        jinja_raise(P->a->err, TSR_ERR_UNSUPPORTED, cur(P)->line, "template nested too deeply (over 200 levels)");
}

static jnode *parse_expression(parser *P, int with_condexpr)
{
    enter(P);
    jnode *n = with_condexpr ? parse_condexpr(P) : parse_or(P);
    P->depth--;
    return n;
}

/* ---- statements ---- */

static void subparse(parser *P, jnodes *out, const char *const *end_tags);

/* Target of for/set/with: a name, "ns.attr" (when allowed) or a tuple of names. */
static jnode *parse_assign_target(parser *P, int with_namespace, const char *extra_end)
{
    int line = cur(P)->line;
    if (with_namespace && cur(P)->t == TK_NAME && is_op(peek(P, 1), ".")) {
        jnode *n = mk(P, N_ATTR, line);
        n->a = mk(P, N_NAME, line);
        n->a->name = expect_name(P);
        adv(P);
        n->name = expect_name(P);
        return n;
    }
    jnode *tup = mk(P, N_TUPLE, line);
    int parens = 0, had_comma = 0;
    if (is_op(cur(P), "(")) {
        parens = 1;
        adv(P);
    }
    for (;;) {
        jtoken *t = cur(P);
        if (t->t != TK_NAME) syntax(P, t, "a variable name to assign to");
        if (is_name(t, "true") || is_name(t, "false") || is_name(t, "none") || is_name(t, "True") ||
            is_name(t, "False") || is_name(t, "None"))
            jinja_raise(P->a->err, TSR_ERR_FORMAT, t->line, "syntax error: cannot assign to '%.*s'", (int)t->n, t->p);
        jnode *nm = mk(P, N_NAME, t->line);
        nm->name = expect_name(P);
        push(P, &tup->args, nm);
        if (!is_op(cur(P), ",")) break;
        adv(P);
        had_comma = 1;
        if (parens && is_op(cur(P), ")")) break;
        if (!parens && (is_tuple_end(P, extra_end) || is_op(cur(P), "="))) break;
    }
    if (parens) expect_op(P, ")");
    if (tup->args.n == 1 && !parens && !had_comma) return tup->args.v[0];
    return tup;
}

static jnode *parse_for(parser *P, int line)
{
    jnode *n = mk(P, S_FOR, line);
    n->a = parse_assign_target(P, 0, "in");
    if (!is_name(cur(P), "in")) syntax(P, cur(P), "'in'");
    adv(P);
    n->b = parse_tuple(P, 0, "recursive", 0);
    if (is_name(cur(P), "if")) {
        adv(P);
        n->c = parse_expression(P, 1);
    }
    if (is_name(cur(P), "recursive"))
        jinja_raise(P->a->err, TSR_ERR_UNSUPPORTED, cur(P)->line, "unsupported construct: recursive for loop");
    expect_block_end(P);
    static const char *const ends1[] = {"endfor", "else", NULL};
    static const char *const ends2[] = {"endfor", NULL};
    P->loop_depth++;
    subparse(P, &n->body, ends1);
    P->loop_depth--;
    if (is_name(cur(P), "else")) {
        adv(P);
        expect_block_end(P);
        subparse(P, &n->orelse, ends2);
    }
    adv(P); /* endfor */
    expect_block_end(P);
    return n;
}

static jnode *parse_if(parser *P, int line)
{
    jnode *n = mk(P, S_IF, line);
    jnode *node = n;
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    static const char *const ends2[] = {"endif", NULL};
    for (;;) {
        node->a = parse_tuple(P, 0, NULL, 0);
        expect_block_end(P);
        subparse(P, &node->body, ends);
        if (is_name(cur(P), "elif")) {
            jnode *e = mk(P, S_IF, cur(P)->line);
            adv(P);
            push(P, &node->orelse, e);
            node = e;
            continue;
        }
        if (is_name(cur(P), "else")) {
            adv(P);
            expect_block_end(P);
            subparse(P, &node->orelse, ends2);
        }
        break;
    }
    adv(P); /* endif */
    expect_block_end(P);
    return n;
}

static jnode *parse_set(parser *P, int line)
{
    jnode *target = parse_assign_target(P, 1, NULL);
    if (is_op(cur(P), "=")) {
        adv(P);
        jnode *n = mk(P, S_SET, line);
        n->a = target;
        n->b = parse_tuple(P, 1, NULL, 0);
        expect_block_end(P);
        return n;
    }
    if (is_op(cur(P), "|"))
        jinja_raise(P->a->err, TSR_ERR_UNSUPPORTED, cur(P)->line, "unsupported construct: filtered block set");
    jnode *n = mk(P, S_SETBLOCK, line);
    n->a = target;
    expect_block_end(P);
    static const char *const ends[] = {"endset", NULL};
    subparse(P, &n->body, ends);
    adv(P);
    expect_block_end(P);
    return n;
}

static jnode *parse_macro(parser *P, int line)
{
    jnode *n = mk(P, S_MACRO, line);
    n->name = expect_name(P);
    expect_op(P, "(");
    while (!is_op(cur(P), ")")) {
        if (n->args.n) expect_op(P, ",");
        if (is_op(cur(P), ")")) break;
        jnode *a = mk(P, N_NAME, cur(P)->line);
        a->name = expect_name(P);
        push(P, &n->args, a);
        if (is_op(cur(P), "=")) {
            adv(P);
            push(P, &n->kwargs, parse_expression(P, 1));
        } else {
            if (n->kwargs.n && n->kwargs.v[n->kwargs.n - 1])
                jinja_raise(P->a->err, TSR_ERR_FORMAT, a->line,
                            "syntax error: non-default argument follows default argument");
            push(P, &n->kwargs, NULL);
        }
    }
    adv(P);
    expect_block_end(P);
    static const char *const ends[] = {"endmacro", NULL};
    int saved = P->loop_depth;
    P->loop_depth = 0;
    P->macro_depth++;
    subparse(P, &n->body, ends);
    P->macro_depth--;
    P->loop_depth = saved;
    adv(P);
    expect_block_end(P);
    return n;
}

static jnode *parse_with(parser *P, int line)
{
    jnode *n = mk(P, S_WITH, line);
    while (cur(P)->t != TK_BLOCK_END) {
        if (n->args.n) expect_op(P, ",");
        jnode *t = parse_assign_target(P, 0, NULL);
        if (t->kind != N_NAME)
            jinja_raise(P->a->err, TSR_ERR_UNSUPPORTED, t->line, "unsupported construct: tuple target in with");
        expect_op(P, "=");
        push(P, &n->args, t);
        push(P, &n->kwargs, parse_expression(P, 1));
    }
    expect_block_end(P);
    static const char *const ends[] = {"endwith", NULL};
    subparse(P, &n->body, ends);
    adv(P);
    expect_block_end(P);
    return n;
}

static jnode *parse_filter_block(parser *P, int line)
{
    jnode *n = mk(P, S_FILTERBLOCK, line);
    jnode *chain = parse_filter(P, NULL);
    while (is_op(cur(P), "|")) {
        adv(P);
        chain = parse_filter(P, chain);
    }
    n->a = chain;
    expect_block_end(P);
    static const char *const ends[] = {"endfilter", NULL};
    subparse(P, &n->body, ends);
    adv(P);
    expect_block_end(P);
    return n;
}

static jnode *parse_statement_inner(parser *P, jtoken *t, int line);

static jnode *parse_statement(parser *P)
{
    jtoken *t = cur(P);
    if (t->t != TK_NAME) syntax(P, t, "a statement name");
    int line = t->line;
    enter(P);
    jnode *n = parse_statement_inner(P, t, line);
    P->depth--;
    return n;
}

static jnode *parse_statement_inner(parser *P, jtoken *t, int line)
{
    /* the tags that open a block, each parsed past its name by its own function */
    static const struct {
        const char *tag;
        jnode *(*parse)(parser *, int);
    } blocks[] = {{"for", parse_for},     {"if", parse_if},     {"set", parse_set},
                  {"macro", parse_macro}, {"with", parse_with}, {"filter", parse_filter_block}};
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++)
        if (is_name(t, blocks[i].tag)) {
            adv(P);
            return blocks[i].parse(P, line);
        }
    if (is_name(t, "break") || is_name(t, "continue")) {
        if (!P->loop_depth)
            jinja_raise(P->a->err, TSR_ERR_FORMAT, line, "syntax error: '%.*s' outside of a loop", (int)t->n, t->p);
        jnode *n = mk(P, is_name(t, "break") ? S_BREAK : S_CONTINUE, line);
        adv(P);
        expect_block_end(P);
        return n;
    }
    if (is_name(t, "generation")) {
        adv(P);
        expect_block_end(P);
        jnode *n = mk(P, S_GENERATION, line);
        static const char *const ends[] = {"endgeneration", NULL};
        subparse(P, &n->body, ends);
        adv(P);
        expect_block_end(P);
        return n;
    }
    static const char *const unsupported[] = {"block", "extends", "include", "import", "from", "call", "autoescape",
                                              "trans", "pluralize", "do", "print", NULL};
    for (int i = 0; unsupported[i]; i++)
        if (is_name(t, unsupported[i]))
            jinja_raise(P->a->err, TSR_ERR_UNSUPPORTED, line, "unsupported construct: '{%% %s %%}' tag",
                        unsupported[i]);
    jinja_raise(P->a->err, TSR_ERR_FORMAT, line, "syntax error: unknown tag '%.*s'", (int)(t->n > 40 ? 40 : t->n),
                t->p);
}

static void subparse(parser *P, jnodes *out, const char *const *end_tags)
{
    for (;;) {
        jtoken *t = cur(P);
        if (t->t == TK_EOF) {
            if (end_tags) {
                char want[128] = "";
                for (int i = 0; end_tags[i]; i++) {
                    if (i) strncat(want, " or ", sizeof want - strlen(want) - 1);
                    strncat(want, "'", sizeof want - strlen(want) - 1);
                    strncat(want, end_tags[i], sizeof want - strlen(want) - 1);
                    strncat(want, "'", sizeof want - strlen(want) - 1);
                }
                jinja_raise(P->a->err, TSR_ERR_FORMAT, t->line, "syntax error: unexpected end of template, expected %s",
                            want);
            }
            return;
        }
        if (t->t == TK_DATA) {
            jnode *n = mk(P, S_DATA, t->line);
            n->cval = jv_str(t->p, t->n);
            push(P, out, n);
            adv(P);
        } else if (t->t == TK_VAR_BEGIN) {
            adv(P);
            jnode *n = mk(P, S_OUTPUT, t->line);
            n->a = parse_tuple(P, 1, NULL, 0);
            if (cur(P)->t != TK_VAR_END) syntax(P, cur(P), "'}}'");
            adv(P);
            push(P, out, n);
        } else if (t->t == TK_BLOCK_BEGIN) {
            adv(P);
            jtoken *nm = cur(P);
            if (end_tags)
                for (int i = 0; end_tags[i]; i++)
                    if (is_name(nm, end_tags[i])) return; /* caller consumes the end tag */
            if (nm->t == TK_NAME &&
                (nm->n > 3 && !memcmp(nm->p, "end", 3) ? 1 : is_name(nm, "else") || is_name(nm, "elif")))
                jinja_raise(P->a->err, TSR_ERR_FORMAT, nm->line, "syntax error: unexpected '%.*s'%s%s%s",
                            (int)(nm->n > 40 ? 40 : nm->n), nm->p, end_tags ? " (expected '" : "",
                            end_tags ? end_tags[0] : "", end_tags ? "')" : "");
            push(P, out, parse_statement(P));
        } else
            syntax(P, t, "template data or a tag");
    }
}

void jinja_parse(jinja_arena *a, const char *src, size_t n, jnodes *out)
{
    jtoken *toks;
    size_t nt;
    jinja_lex(a, src, n, &toks, &nt);
    parser P = {.a = a, .t = toks, .n = nt};
    memset(out, 0, sizeof *out);
    subparse(&P, out, NULL);
}
