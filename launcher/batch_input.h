/* Reading an OpenAI batch input file (JSONL): one request per line,
 *   {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": {...}}
 *
 * tsr_batch_reader_next() hands out one line at a time (never the whole file in memory), already checked against
 * the batch format: a line that is not JSON, lacks a string custom_id, has another method than POST, an unknown
 * url or no body object is returned with an error code and message (the OpenAI batch codes, see docs/batch.md)
 * instead of failing the run. Blank lines are skipped; CRLF endings are accepted; a line longer than the cap
 * (TSR_BATCH_MAX_LINE) is skipped to its end and reported as line_too_long. The body itself is not checked here
 * (launcher/openai.h parses it when the request is submitted).
 *
 * Ownership: the reader owns its buffer; a tsr_batch_line owns its JSON (tsr_batch_line_clear() releases it).
 * Errors: TSR_ERR_IO when the file cannot be opened or read, TSR_ERR_NOMEM. */
#ifndef TSR_LAUNCHER_BATCH_INPUT_H
#define TSR_LAUNCHER_BATCH_INPUT_H

#include "runtime/status.h"

#include <jansson.h>
#include <stddef.h>
#include <stdio.h>

#define TSR_BATCH_MAX_LINE      (64u << 20) /* bytes in one input line */
#define TSR_BATCH_MAX_CUSTOM_ID 512         /* bytes in one custom_id */

typedef enum tsr_batch_url {
    TSR_BATCH_URL_NONE = 0,
    TSR_BATCH_URL_COMPLETIONS, /* /v1/completions */
    TSR_BATCH_URL_CHAT,        /* /v1/chat/completions */
} tsr_batch_url;

typedef struct tsr_batch_line {
    long line_no;          /* 1-based line number in the file */
    json_t *root;          /* the parsed line (owned), or NULL when it is not JSON */
    const char *custom_id; /* borrowed from root; NULL when absent or not a string */
    size_t custom_id_len;
    tsr_batch_url url;
    json_t *body;         /* borrowed from root */
    const char *err_code; /* NULL for a good line, else e.g. "invalid_json_line" */
    char err_msg[256];
} tsr_batch_line;

typedef struct tsr_batch_reader tsr_batch_reader;

/* Opens path ("-" reads stdin). */
tsr_status tsr_batch_reader_open(const char *path, tsr_batch_reader **out);
void tsr_batch_reader_close(tsr_batch_reader *r);

/* Reads the next non-blank line into *line (cleared first). *eof = 1 (and *line empty) at the end of the file. */
tsr_status tsr_batch_reader_next(tsr_batch_reader *r, tsr_batch_line *line, int *eof);

/* Bytes of the input consumed so far (for progress). */
long long tsr_batch_reader_offset(const tsr_batch_reader *r);

void tsr_batch_line_clear(tsr_batch_line *line);

/* Checks one line's text against the batch format (what tsr_batch_reader_next does for each line). */
tsr_status tsr_batch_line_parse(const char *text, size_t len, long line_no, tsr_batch_line *line);

/* Path of a url kind ("/v1/completions", ...), or "" for NONE. */
const char *tsr_batch_url_path(tsr_batch_url url);

#endif
