/* Helpers of the tokenizer tests: fixture paths and checking one reference entry (text, ids, ids_with_special,
 * decoded) against tessera's encoder, decoder and streaming detokenizer. */
#ifndef TSR_TESTS_TEXT_TOK_CHECK_H
#define TSR_TESTS_TEXT_TOK_CHECK_H

#include "runtime/text/tokenizer.h"

#include <jansson.h>

/* Path of a tokenizer of the fixtures by name: llama2, llama3, qwen3 (tokenizer.json, decompressed in the build
 * fixtures) or tiny (the tiny model's folder). Returns a static buffer. */
const char *tok_fixture_path(const char *name);
/* Path under $TSR_FIXTURES or $TSR_FIXTURES_BUILD (first that exists); NULL when absent. Static buffer. */
const char *tok_fixture_file(const char *rel);

/* Checks one entry; prints every mismatch (prefixed with `what`) and returns the number of mismatches. */
int tok_check_entry(const tsr_tokenizer *tok, json_t *entry, const char *what);
/* Checks that streaming ids one by one (skip_special) gives decode(ids, skip_special); returns mismatches. */
int tok_check_stream(const tsr_tokenizer *tok, const int32_t *ids, size_t n, int skip_special, const char *what);

#endif
