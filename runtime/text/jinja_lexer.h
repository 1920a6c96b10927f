/* Lexer of the chat-template interpreter: template source to a token array.
 *
 * Reproduces Jinja2's lexer as Hugging Face configures it (trim_blocks=True, lstrip_blocks=True,
 * keep_trailing_newline=False): newlines normalized to "\n", one trailing newline dropped, "{%-"/"-%}" strip all
 * whitespace, "+" disables lstrip/trim, the first newline after a block or comment tag is removed and spaces/tabs
 * before a block or comment tag at the start of a line are removed. {% raw %} bodies become plain data.
 *
 * Ownership: tokens and decoded strings live in the arena. Errors: syntax errors raise TSR_ERR_FORMAT with the
 * template line through the arena's jinja_err. */
#ifndef TSR_TEXT_JINJA_LEXER_H
#define TSR_TEXT_JINJA_LEXER_H

#include "runtime/text/jinja_value.h"

typedef enum {
    TK_EOF,
    TK_DATA,
    TK_VAR_BEGIN,
    TK_VAR_END,
    TK_BLOCK_BEGIN,
    TK_BLOCK_END,
    TK_NAME,
    TK_STRING,
    TK_INT,
    TK_FLOAT,
    TK_OP
} jtok_type;

typedef struct jtoken {
    jtok_type t;
    int line;
    const char *p; /* DATA, NAME, STRING (decoded), OP text */
    size_t n;
    int64_t i;
    double f;
} jtoken;

/* Tokenizes src[0..n). *out: array ending with a TK_EOF token. */
void jinja_lex(jinja_arena *a, const char *src, size_t n, jtoken **out, size_t *count);

#endif
