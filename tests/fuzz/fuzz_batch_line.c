/* Fuzz target: OpenAI batch files (launcher/batch_input.h, launcher/batch_resume.h). The input is written to a
 * temporary file and read twice, as tessera batch reads its files:
 *   (1) as the input file: every line through tsr_batch_reader_next() (line splitting, CRLF, blank lines, the
 *       envelope check of tsr_batch_line_parse()), and the body of every good line parsed as an OpenAI request
 *       against the bundled tiny model (what the job does when it submits the line);
 *   (2) as an earlier run's output file: tsr_batch_done_load(), the resume index.
 * Checked beyond crashes, sanitizer reports and leaks: every non-blank line is handed out once, in order, with its
 * line number (whatever bytes it holds, NUL included) and the reader's offset ends at the file size; a good line
 * has a custom_id of 1 to 512 bytes, a url and a body object, a bad one an error code and message; a loaded output
 * file's good part ends at a line end and good plus dropped bytes are the whole file. */
#include "launcher/batch_input.h"
#include "launcher/batch_resume.h"
#include "tests/fuzz/fuzz_oai_model.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what)
{
    if (ok) return;
    fprintf(stderr, "fuzz_batch_line: %s\n", what);
    abort();
}

/* 1-based line number of the k-th (0-based) non-blank line of data (blank: only spaces and tabs before an optional
 * CR), or 0 when there are fewer lines: what the reader must hand out, in order. */
static long nth_line(const uint8_t *data, size_t size, int k)
{
    size_t i = 0;
    for (long no = 1; i < size; no++) {
        const uint8_t *nl = memchr(data + i, '\n', size - i);
        size_t end = nl ? (size_t)(nl - data) : size, e = end;
        if (e > i && data[e - 1] == '\r') e--;
        size_t j = i;
        while (j < e && (data[j] == ' ' || data[j] == '\t'))
            j++;
        if (j < e && k-- == 0) return no;
        i = end + 1;
    }
    return 0;
}

static void read_input(const char *path, const uint8_t *data, size_t size)
{
    tsr_batch_reader *r;
    if (tsr_batch_reader_open(path, &r) != TSR_OK) return;
    tsr_batch_line line = {0};
    int k;
    for (k = 0; k < 256; k++) { /* bounded: a mutated file can hold thousands of short lines */
        int eof = 0;
        if (tsr_batch_reader_next(r, &line, &eof) != TSR_OK) break;
        if (eof) {
            check(nth_line(data, size, k) == 0, "the reader stopped before the last line");
            check(tsr_batch_reader_offset(r) == (long long)size, "the reader's offset is not the file size at its end");
            break;
        }
        check(line.line_no == nth_line(data, size, k), "a line handed out with the wrong line number (or lost)");
        if (line.err_code) {
            check(line.err_msg[0] != '\0' && !line.body, "a bad line without a message, or with a body");
            continue;
        }
        check(line.custom_id && line.custom_id_len >= 1 && line.custom_id_len <= TSR_BATCH_MAX_CUSTOM_ID,
              "a good line with a bad custom_id");
        check(line.url != TSR_BATCH_URL_NONE && *tsr_batch_url_path(line.url), "a good line without a url");
        check(json_is_object(line.body), "a good line without a body object");
        tsr_fuzz_oai_parse(line.url == TSR_BATCH_URL_CHAT ? TSR_OAI_CHAT : TSR_OAI_COMPLETIONS, line.body);
    }
    tsr_batch_line_clear(&line);
    tsr_batch_reader_close(r);
}

static void read_output(const char *path, const uint8_t *data, size_t size)
{
    tsr_batch_done d;
    if (tsr_batch_done_load(path, &d) != TSR_OK) return;
    check(d.good_bytes >= 0 && (size_t)d.good_bytes <= size, "good_bytes outside the file");
    check(d.good_bytes == 0 || data[d.good_bytes - 1] == '\n', "good_bytes not at a line end");
    check(d.good_bytes + d.dropped_bytes == (long long)size, "good + dropped bytes are not the file");
    tsr_batch_done_free(&d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tsr_fuzz_oai_model();
    static char path[64];
    if (!path[0])
        snprintf(path, sizeof path, "%s/fuzz-batch-%d.jsonl", access("/dev/shm", W_OK) ? "/tmp" : "/dev/shm",
                 (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    size_t put = fwrite(data, 1, size, f);
    if (fclose(f) || put != size) return 0;
    read_input(path, data, size);
    read_output(path, data, size);
    unlink(path);
    return 0;
}
