/* Filters, tests, methods and global functions of the chat-template interpreter.
 *
 * The parser asks jinja_filter_known / jinja_test_known so that an unknown or unsupported filter or test fails at
 * parse time (as Jinja does), naming the line. The evaluator calls the apply functions with evaluated arguments.
 * Semantics follow Jinja2 3.1 filters and CPython str/dict methods; tojson is the one transformers installs.
 *
 * Errors: raise through the context's jinja_err (TSR_ERR_FORMAT for type errors, TSR_ERR_UNSUPPORTED for
 * methods/arguments not implemented). */
#ifndef TSR_TEXT_JINJA_FILTERS_H
#define TSR_TEXT_JINJA_FILTERS_H

#include "runtime/text/jinja_eval.h"

/* 1: implemented; 0: unknown to Jinja; -1: a real Jinja filter/test that is not implemented. */
int jinja_filter_known(const char *name);
int jinja_test_known(const char *name);

jv jinja_apply_filter(jctx *c, const char *name, jv v, jv *args, size_t nargs, const char **kwn, jv *kwv,
                      size_t nkw, int line);
int jinja_apply_test(jctx *c, const char *name, jv v, jv *args, size_t nargs, int line);

/* Method call obj.name(args). Sets *handled = 0 when obj has no such method (the caller then raises). */
jv jinja_call_method(jctx *c, jv obj, const char *name, jv *args, size_t nargs, const char **kwn, jv *kwv,
                     size_t nkw, int line, int *handled);

#endif
