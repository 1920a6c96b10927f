/* The resume index of tessera batch (see batch_resume.h): one pass over the existing output file. */
#include "launcher/batch_resume.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_OUTPUT_LINE (256u << 20)

void tsr_batch_done_free(tsr_batch_done *d)
{
    if (!d) return;
    tsr_idset_free(&d->ids);
    tsr_idset_free(&d->lines);
    memset(d, 0, sizeof *d);
}

int tsr_batch_done_add_line(tsr_batch_done *d, const char *text, size_t len, tsr_status *st)
{
    *st = TSR_OK;
    json_t *root = json_loadb(text, len, 0, NULL);
    if (!json_is_object(root)) {
        json_decref(root);
        return 0;
    }
    json_t *id = json_object_get(root, "custom_id");
    json_t *err = json_object_get(root, "error");
    const char *code = json_string_value(json_object_get(err, "code"));
    int ok = 1;
    tsr_idset_entry *e = NULL;
    if (json_is_string(id)) {
        *st = tsr_idset_get(&d->ids, json_string_value(id), json_string_length(id), 1, &e);
        if (*st == TSR_OK) {
            if (code && !strcmp(code, "duplicate_custom_id"))
                e->count++;
            else
                e->done = 1;
        }
    } else if (json_is_null(id) || !id) {
        json_t *line = json_object_get(err, "line");
        if (json_is_integer(line)) {
            char key[32];
            int n = snprintf(key, sizeof key, "%lld", (long long)json_integer_value(line));
            *st = tsr_idset_get(&d->lines, key, (size_t)n, 1, &e);
            if (*st == TSR_OK) e->done = 1;
        } else if (!err) {
            ok = 0; /* neither an id nor an error: not one of our lines */
        }
    } else {
        ok = 0;
    }
    json_decref(root);
    return ok;
}

tsr_status tsr_batch_done_load(const char *path, tsr_batch_done *d)
{
    memset(d, 0, sizeof *d);
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT) return TSR_OK;
        return tsr_fail(TSR_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    }
    tsr_status st = TSR_OK;
    char *buf = NULL;
    size_t cap = 0, len = 0;
    long long offset = 0; /* start of the line being read */
    long line_no = 0, first_bad = 0;
    int c = 0;
    for (;;) {
        c = getc(f);
        if (c == EOF) break;
        if (c != '\n') {
            if (len + 1 >= cap) {
                if (cap >= MAX_OUTPUT_LINE) {
                    st = tsr_fail(TSR_ERR_FORMAT, "%s: line %ld is longer than %u bytes: not a batch output file", path,
                                  line_no + 1, MAX_OUTPUT_LINE);
                    break;
                }
                size_t ncap = cap ? cap * 2 : 65536;
                char *b = realloc(buf, ncap);
                if (!b) {
                    st = tsr_fail(TSR_ERR_NOMEM, "out of memory reading %s", path);
                    break;
                }
                buf = b;
                cap = ncap;
            }
            buf[len++] = (char)c;
            continue;
        }
        line_no++;
        long long next = offset + (long long)len + 1;
        int good = len > 0 && tsr_batch_done_add_line(d, buf, len, &st);
        if (st != TSR_OK) break;
        if (good) {
            if (first_bad) {
                st = tsr_fail(TSR_ERR_FORMAT,
                              "%s: line %ld is not a batch output line but later lines are: refusing to resume "
                              "into a damaged or foreign file",
                              path, first_bad);
                break;
            }
            d->n_lines++;
            d->good_bytes = next;
        } else if (!first_bad) {
            first_bad = line_no;
        }
        offset = next;
        len = 0;
    }
    if (st == TSR_OK && ferror(f)) st = tsr_fail(TSR_ERR_IO, "reading %s: %s", path, strerror(errno));
    if (st == TSR_OK) d->dropped_bytes = offset + (long long)len - d->good_bytes;
    free(buf);
    fclose(f);
    if (st != TSR_OK) tsr_batch_done_free(d);
    return st;
}
