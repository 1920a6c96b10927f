/* Tree-walking evaluator of the chat-template interpreter.
 *
 * A render runs the statement list of a parsed template against a root scope of variables, appending text to the
 * context's output buffer. Scopes follow Jinja2: a for-loop iteration, a macro call and a with block each get a
 * fresh scope (so plain `set` inside a loop does not leak out, which is why templates use namespace()); `if` does
 * not. Undefined behaves like Jinja2's default Undefined: printing it gives "", iterating it gives nothing, but
 * attribute access, arithmetic or calling on it is an error naming the variable.
 *
 * Ownership: everything lives in the context's arena. Errors: raised through the arena's jinja_err with the
 * template line: TSR_ERR_FORMAT for runtime type errors, TSR_ERR_UNSUPPORTED for constructs not implemented,
 * TSR_ERR_ARG for raise_exception(), TSR_ERR_NOMEM when the memory or step limits are exceeded. */
#ifndef TSR_TEXT_JINJA_EVAL_H
#define TSR_TEXT_JINJA_EVAL_H

#include "runtime/text/jinja_ast.h"

typedef struct jscope {
    struct jscope *parent;
    jv vars; /* dict */
} jscope;

typedef struct jinja_macro {
    const jnode *node;
    jscope *closure;
} jinja_macro;

typedef struct jloop {
    jv items; /* list */
    size_t index0;
} jloop;

typedef enum { JF_RANGE = 1, JF_NAMESPACE, JF_DICT, JF_RAISE, JF_STRFTIME } jfunc_id;

typedef struct jctx {
    jinja_arena *a;
    jinja_err *err;
    jbuf *out;
    jscope *cur;
    int ctl; /* 1: break, 2: continue pending */
    int depth;
    uint64_t steps, max_steps;
} jctx;

/* Renders statements into c->out. */
void jinja_exec(jctx *c, const jnodes *body);
jv jinja_eval(jctx *c, const jnode *e);

/* Helpers shared with the filters. */
jv jinja_getattr(jctx *c, jv obj, const char *name, int line);
jv jinja_getitem(jctx *c, jv obj, jv key, int line);
jv jinja_to_list(jctx *c, jv v, int line); /* list(v): list, tuple, dict keys, string chars, undefined -> [] */
jv jinja_str(jctx *c, jv v);               /* str(v) as a string value */
int jinja_compare(jctx *c, jv a, jv b, int line); /* <0, 0, >0; raises on unorderable types */
jv jinja_call_value(jctx *c, jv fn, jv *args, size_t nargs, const char **kwn, jv *kwv, size_t nkw, int line);
_Noreturn void jinja_undefined_error(jctx *c, jv u, int line);

#endif
