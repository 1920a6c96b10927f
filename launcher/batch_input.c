/* The batch input reader (see batch_input.h): bounded line reads through stdio's buffer, then a check of each
 * line's envelope (custom_id, method, url, body) that reports the first thing wrong with it. */
#include "launcher/batch_input.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

struct tsr_batch_reader {
    FILE *f;
    int own;
    char *buf;
    size_t cap;
    long line_no;
    long long offset;
};

tsr_status tsr_batch_reader_open(const char *path, tsr_batch_reader **out)
{
    tsr_batch_reader *r = calloc(1, sizeof *r);
    if (!r) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    if (!strcmp(path, "-")) {
        r->f = stdin;
    } else if (!(r->f = fopen(path, "rb"))) {
        free(r);
        return tsr_fail(TSR_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    } else {
        r->own = 1;
    }
    *out = r;
    return TSR_OK;
}

void tsr_batch_reader_close(tsr_batch_reader *r)
{
    if (!r) return;
    if (r->own) fclose(r->f);
    free(r->buf);
    free(r);
}

long long tsr_batch_reader_offset(const tsr_batch_reader *r)
{
    return r->offset;
}

void tsr_batch_line_clear(tsr_batch_line *line)
{
    json_decref(line->root);
    memset(line, 0, sizeof *line);
}

const char *tsr_batch_url_path(tsr_batch_url url)
{
    switch (url) {
    case TSR_BATCH_URL_COMPLETIONS:
        return "/v1/completions";
    case TSR_BATCH_URL_CHAT:
        return "/v1/chat/completions";
    case TSR_BATCH_URL_NONE:
        break;
    }
    return "";
}

static tsr_status bad(tsr_batch_line *line, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static tsr_status bad(tsr_batch_line *line, const char *code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line->err_msg, sizeof line->err_msg, fmt, ap);
    va_end(ap);
    line->err_code = code;
    return TSR_OK;
}

tsr_status tsr_batch_line_parse(const char *text, size_t len, long line_no, tsr_batch_line *line)
{
    tsr_batch_line_clear(line);
    line->line_no = line_no;
    json_error_t jerr;
    line->root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!line->root)
        return bad(line, "invalid_json_line", "line %ld is not valid JSON: %s (column %d)", line_no, jerr.text,
                   jerr.column);
    if (!json_is_object(line->root)) return bad(line, "invalid_json_line", "line %ld is not a JSON object", line_no);
    json_t *id = json_object_get(line->root, "custom_id");
    if (json_is_string(id)) {
        line->custom_id = json_string_value(id);
        line->custom_id_len = json_string_length(id);
    }
    if (!id) return bad(line, "missing_required_parameter", "line %ld has no custom_id", line_no);
    if (!json_is_string(id) || line->custom_id_len == 0 || line->custom_id_len > TSR_BATCH_MAX_CUSTOM_ID) {
        line->custom_id = NULL;
        return bad(line, "invalid_custom_id", "line %ld: custom_id must be a string of 1 to %d bytes", line_no,
                   TSR_BATCH_MAX_CUSTOM_ID);
    }
    json_t *method = json_object_get(line->root, "method");
    if (!method) return bad(line, "missing_required_parameter", "line %ld has no method", line_no);
    if (!json_is_string(method) || strcmp(json_string_value(method), "POST"))
        return bad(line, "invalid_method", "line %ld: method must be \"POST\"", line_no);
    json_t *url = json_object_get(line->root, "url");
    if (!url) return bad(line, "missing_required_parameter", "line %ld has no url", line_no);
    const char *u = json_is_string(url) ? json_string_value(url) : "";
    if (!strcmp(u, "/v1/completions"))
        line->url = TSR_BATCH_URL_COMPLETIONS;
    else if (!strcmp(u, "/v1/chat/completions"))
        line->url = TSR_BATCH_URL_CHAT;
    else
        return bad(line, "invalid_url", "line %ld: url must be /v1/completions or /v1/chat/completions", line_no);
    json_t *body = json_object_get(line->root, "body");
    if (!body) return bad(line, "missing_required_parameter", "line %ld has no body", line_no);
    if (!json_is_object(body)) return bad(line, "invalid_body", "line %ld: body must be a JSON object", line_no);
    line->body = body;
    return TSR_OK;
}

/* Reads one raw line into r->buf (without its newline). *too_long when it went past the cap (the rest of it is
 * consumed). *got = 0 at the end of the file. Byte by byte (getc_unlocked, buffered by stdio) rather than fgets,
 * whose result length strlen would cut at a NUL byte, merging the rest of the file's next line into this one. */
static tsr_status read_raw(tsr_batch_reader *r, size_t *len, int *too_long, int *got)
{
    *len = 0;
    *too_long = 0;
    *got = 0;
    for (;;) {
        int c = getc_unlocked(r->f);
        if (c == EOF) {
            if (ferror(r->f)) return tsr_fail(TSR_ERR_IO, "reading the input: %s", strerror(errno));
            return TSR_OK; /* end of file: *got says whether a last line without newline was read */
        }
        r->offset++;
        *got = 1;
        if (c == '\n') return TSR_OK;
        if (*too_long) continue;
        if (*len + 1 >= r->cap) {
            if (r->cap >= TSR_BATCH_MAX_LINE + 8192) { /* over the cap: drop it and keep reading to the newline */
                *too_long = 1;
                *len = 0;
                continue;
            }
            size_t cap = r->cap ? r->cap * 2 : 65536;
            if (cap > TSR_BATCH_MAX_LINE + 8192) cap = TSR_BATCH_MAX_LINE + 8192;
            char *b = realloc(r->buf, cap);
            if (!b) return tsr_fail(TSR_ERR_NOMEM, "out of memory reading line %ld", r->line_no + 1);
            r->buf = b;
            r->cap = cap;
        }
        r->buf[(*len)++] = (char)c;
    }
}

tsr_status tsr_batch_reader_next(tsr_batch_reader *r, tsr_batch_line *line, int *eof)
{
    tsr_batch_line_clear(line);
    for (;;) {
        size_t len;
        int too_long, got;
        TSR_TRY(read_raw(r, &len, &too_long, &got));
        if (!got) {
            *eof = 1;
            return TSR_OK;
        }
        r->line_no++;
        *eof = 0;
        if (too_long) {
            line->line_no = r->line_no;
            return bad(line, "line_too_long", "line %ld is longer than %u bytes", r->line_no, TSR_BATCH_MAX_LINE);
        }
        if (len && r->buf[len - 1] == '\r') len--;
        size_t i = 0;
        while (i < len && (r->buf[i] == ' ' || r->buf[i] == '\t'))
            i++;
        if (i == len) continue; /* blank line */
        return tsr_batch_line_parse(r->buf, len, r->line_no, line);
    }
}
