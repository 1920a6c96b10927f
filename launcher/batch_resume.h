/* What an earlier run of tessera batch already wrote to the output file, so a rerun completes only the rest.
 *
 * tsr_batch_done_load() reads the output file (a missing or empty file is a fresh start) line by line:
 *   - a line with a string custom_id and any result (a response, or a line-level error) marks that id done;
 *   - a duplicate_custom_id error line counts one reported duplicate of that id (a rerun writes the error again
 *     only for duplicates beyond that count, so the first occurrence still runs exactly once);
 *   - an error line with "custom_id": null (a line that could not be identified) records its input line number
 *     (error.line), so a rerun does not report it twice.
 * The writer appends one whole line per write, so only the tail can be damaged by a crash or a full disk: bytes
 * after the last newline, and newline-terminated lines that are not JSON objects (e.g. NUL blocks after a power
 * loss), are dropped: good_bytes tells the writer where to cut. A damaged line followed by good ones means the file
 * is not ours (or was edited), and loading fails rather than guessing.
 *
 * Ownership: the caller owns the struct and frees it with tsr_batch_done_free(). Errors: TSR_ERR_IO (unreadable),
 * TSR_ERR_FORMAT (damage in the middle; the message names the line), TSR_ERR_NOMEM. */
#ifndef TSR_LAUNCHER_BATCH_RESUME_H
#define TSR_LAUNCHER_BATCH_RESUME_H

#include "launcher/batch_idset.h"

typedef struct tsr_batch_done {
    tsr_idset ids;           /* custom_id -> done (a result line exists), count (duplicate errors written) */
    tsr_idset lines;         /* decimal input line numbers of unidentified-line errors already written */
    long n_lines;            /* good lines in the file */
    long long good_bytes;    /* offset just past the last good line */
    long long dropped_bytes; /* damaged tail bytes beyond good_bytes */
} tsr_batch_done;

tsr_status tsr_batch_done_load(const char *path, tsr_batch_done *d);
void tsr_batch_done_free(tsr_batch_done *d);

/* Classifies one output line's JSON into d (exported for the writer's tests). Returns 0 when the line is not a
 * batch output line. */
int tsr_batch_done_add_line(tsr_batch_done *d, const char *text, size_t len, tsr_status *st);

#endif
