/* Syntax tree of the chat-template interpreter and the parser that builds it from tokens.
 *
 * The grammar and operator precedence follow Jinja2's parser (condexpr < or < and < not < compare < + - < ~ <
 * * / // % < ** < unary < postfix/filters/tests). Statements: if/elif/else, for (else, loop filter), set (name,
 * tuple, namespace attribute, block form), macro, break/continue, with, filter blocks and the transformers
 * generation block. Anything else Jinja knows (extends, block, include, import, call, ...) is rejected.
 *
 * Ownership: nodes live in the arena. Errors: syntax errors raise TSR_ERR_FORMAT, constructs Jinja supports but
 * this interpreter does not raise TSR_ERR_UNSUPPORTED; both name the template line. */
#ifndef TSR_TEXT_JINJA_AST_H
#define TSR_TEXT_JINJA_AST_H

#include "runtime/text/jinja_lexer.h"

typedef enum {
    /* expressions */
    N_CONST,
    N_NAME,
    N_ATTR,  /* a.name */
    N_ITEM,  /* a[b] */
    N_SLICE, /* a[b:c:d], missing parts NULL */
    N_CALL,  /* a(args, kwargs) */
    N_FILTER, /* a | name(args, kwargs); a NULL inside a filter block: the block's text */
    N_TEST,  /* a is [not] name(args); op = negated */
    N_BIN,   /* op: '+', '-', '*', '/', 'F' (//), '%', 'P' (**), '~' */
    N_CMP,   /* a (ops[i] args[i])... ; ops: 'e' ==, 'n' !=, '<', '>', 'l' <=, 'g' >=, 'i' in, 'I' not in */
    N_AND,
    N_OR,
    N_NOT,
    N_NEG,
    N_POS,
    N_COND, /* b if a else c */
    N_LIST,
    N_TUPLE,
    N_DICT, /* args: keys, kwargs: values */
    /* statements */
    S_DATA,
    S_OUTPUT,
    S_IF,    /* a: test, body, orelse */
    S_FOR,   /* a: target, b: iterable, c: filter or NULL, body, orelse */
    S_SET,   /* a: target, b: value */
    S_SETBLOCK, /* a: target, body */
    S_MACRO, /* name, args: parameters (N_NAME), kwargs: defaults (NULL entries: none), body */
    S_BREAK,
    S_CONTINUE,
    S_WITH,  /* args: targets, kwargs: values, body */
    S_FILTERBLOCK, /* a: filter chain whose innermost operand is NULL, body */
    S_GENERATION /* body */
} jnode_kind;

typedef struct jnode jnode;
typedef struct jnodes {
    jnode **v;
    size_t n, cap;
} jnodes;

struct jnode {
    jnode_kind kind;
    int line;
    int op;
    const char *name; /* NUL-terminated */
    jv cval;
    jnode *a, *b, *c, *d;
    jnodes args, kwargs;
    const char **kwnames; /* N_CALL / N_FILTER / N_TEST: names of kwargs */
    int *ops;             /* N_CMP */
    jnodes body, orelse;
};

/* Parses a whole template. *out: statement list. */
void jinja_parse(jinja_arena *a, const char *src, size_t n, jnodes *out);

#endif
