/* Whole-line appends with rollback on failure (see batch_writer.h). */
#include "launcher/batch_writer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SYNC_LINES   256
#define SYNC_SECONDS 1.0

struct tsr_batch_writer {
    int fd;
    char *path;
    char *buf; /* line + '\n' */
    size_t cap;
    long long size; /* file size after the last whole line */
    long lines, unsynced;
    double last_sync;
    long fail_after; /* test hook: -1 off */
    int failed;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

tsr_status tsr_batch_writer_open(const char *path, long long keep_bytes, tsr_batch_writer **out)
{
    tsr_batch_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(path))) {
        free(w);
        return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    }
    w->fail_after = -1;
    const char *hook = getenv("TSR_TEST_WRITE_FAIL_AFTER");
    if (hook && *hook) w->fail_after = strtol(hook, NULL, 10);
    w->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        tsr_status st = tsr_fail(TSR_ERR_IO, "cannot open %s for writing: %s", path, strerror(errno));
        free(w->path);
        free(w);
        return st;
    }
    struct stat sb;
    if (fstat(w->fd, &sb) || (sb.st_size > keep_bytes && ftruncate(w->fd, (off_t)keep_bytes))) {
        tsr_status st = tsr_fail(TSR_ERR_IO, "cannot cut %s to %lld bytes: %s", path, keep_bytes, strerror(errno));
        close(w->fd);
        free(w->path);
        free(w);
        return st;
    }
    w->size = sb.st_size > keep_bytes ? keep_bytes : (long long)sb.st_size;
    w->last_sync = now_s();
    *out = w;
    return TSR_OK;
}

long tsr_batch_writer_lines(const tsr_batch_writer *w)
{
    return w->lines;
}

/* Writes all of buf[0..n) unless an error (or the test hook) stops it; errno says why. */
static int write_all(tsr_batch_writer *w, const char *buf, size_t n)
{
    size_t done = 0;
    if (w->fail_after >= 0 && w->lines >= w->fail_after) {
        if (n / 2 && write(w->fd, buf, n / 2) < 0) return -1;
        errno = ENOSPC;
        return -1;
    }
    while (done < n) {
        ssize_t k = write(w->fd, buf + done, n - done);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (k == 0) {
            errno = ENOSPC;
            return -1;
        }
        done += (size_t)k;
    }
    return 0;
}

tsr_status tsr_batch_writer_sync(tsr_batch_writer *w)
{
    if (w->failed) return tsr_fail(TSR_ERR_IO, "%s: an earlier write failed", w->path);
    if (w->unsynced && fsync(w->fd)) {
        w->failed = 1;
        return tsr_fail(TSR_ERR_IO, "cannot sync %s: %s", w->path, strerror(errno));
    }
    w->unsynced = 0;
    w->last_sync = now_s();
    return TSR_OK;
}

tsr_status tsr_batch_writer_put(tsr_batch_writer *w, const char *text, size_t len)
{
    if (w->failed) return tsr_fail(TSR_ERR_IO, "%s: an earlier write failed", w->path);
    if (memchr(text, '\n', len)) return tsr_fail(TSR_ERR_INTERNAL, "a batch output line contains a newline");
    if (len + 1 > w->cap) {
        size_t cap = len + 1 > 2 * w->cap ? len + 1 : 2 * w->cap;
        char *b = realloc(w->buf, cap);
        if (!b) return tsr_fail(TSR_ERR_NOMEM, "out of memory (output line of %zu bytes)", len);
        w->buf = b;
        w->cap = cap;
    }
    memcpy(w->buf, text, len);
    w->buf[len] = '\n';
    if (write_all(w, w->buf, len + 1)) {
        int err = errno;
        w->failed = 1;
        /* cut the partial line off again so the file ends with a whole line */
        if (ftruncate(w->fd, (off_t)w->size))
            return tsr_fail(TSR_ERR_IO,
                            "writing %s: %s (the partial last line could not be removed: %s; a rerun "
                            "drops it)",
                            w->path, strerror(err), strerror(errno));
        return tsr_fail(TSR_ERR_IO, "writing %s: %s", w->path, strerror(err));
    }
    w->size += (long long)len + 1;
    w->lines++;
    w->unsynced++;
    if (w->unsynced >= SYNC_LINES || now_s() - w->last_sync >= SYNC_SECONDS) return tsr_batch_writer_sync(w);
    return TSR_OK;
}

tsr_status tsr_batch_writer_close(tsr_batch_writer *w)
{
    if (!w) return TSR_OK;
    tsr_status st = TSR_OK;
    if (!w->failed) st = tsr_batch_writer_sync(w);
    if (close(w->fd) && st == TSR_OK) st = tsr_fail(TSR_ERR_IO, "closing %s: %s", w->path, strerror(errno));
    free(w->buf);
    free(w->path);
    free(w);
    return st;
}
