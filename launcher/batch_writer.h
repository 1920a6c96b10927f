/* The output file of tessera batch: whole lines appended, each with one write(), synced at intervals.
 *
 * A result line is written with a single write() of "line\n" on a file opened with O_APPEND (a short write is
 * continued). If a write fails (disk full, I/O error), the bytes of that line already written are cut off again
 * with ftruncate(), so the file ends with the last whole line; the writer then refuses further lines and the
 * caller stops. Whatever happens, a line is either wholly in the file or not at all, and batch_resume.c drops a
 * damaged tail should the process die between write() and ftruncate(). The file is fsync'ed every
 * `sync_lines` lines or `sync_s` seconds, and on close.
 *
 * Test hook: with TSR_TEST_WRITE_FAIL_AFTER=N in the environment, the writer accepts N lines, then writes half of
 * the next one and fails it with ENOSPC, exactly as a full disk would (then cuts it off as above).
 *
 * Ownership: tsr_batch_writer_close() frees the writer (NULL accepted). Errors: TSR_ERR_IO with the system's
 * message (strerror) naming the file. Not thread-safe (one writing thread). */
#ifndef TSR_LAUNCHER_BATCH_WRITER_H
#define TSR_LAUNCHER_BATCH_WRITER_H

#include "runtime/status.h"

#include <stddef.h>

typedef struct tsr_batch_writer tsr_batch_writer;

/* Opens (creating) path for appending, first cutting it to keep_bytes (what batch_resume.c found good). */
tsr_status tsr_batch_writer_open(const char *path, long long keep_bytes, tsr_batch_writer **out);

/* Appends text (no newline inside) and a newline as one whole line. */
tsr_status tsr_batch_writer_put(tsr_batch_writer *w, const char *text, size_t len);

/* Forces the lines written so far to stable storage. */
tsr_status tsr_batch_writer_sync(tsr_batch_writer *w);

/* Syncs and closes; returns the first error of the sync or the close. */
tsr_status tsr_batch_writer_close(tsr_batch_writer *w);

/* Lines written by this writer. */
long tsr_batch_writer_lines(const tsr_batch_writer *w);

#endif
