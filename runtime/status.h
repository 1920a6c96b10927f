/* Status codes and error messages shared by every fallible function.
 *
 * Every function that can fail on outside input returns a tsr_status. The failing function also records a
 * human-readable message (naming the file, tensor or field at fault) in a thread-local buffer through
 * tsr_fail(); callers that add context use tsr_failf_prefix(). Nothing here allocates. */
#ifndef TSR_STATUS_H
#define TSR_STATUS_H

typedef enum tsr_status {
    TSR_OK = 0,
    TSR_ERR_IO,          /* a file could not be opened, read, mapped or written */
    TSR_ERR_FORMAT,      /* a file or message is malformed: bad header, offsets, shapes, JSON */
    TSR_ERR_UNSUPPORTED, /* well formed, but a feature tessera does not implement */
    TSR_ERR_NOMEM,       /* an allocation failed */
    TSR_ERR_ARG,         /* a caller or command-line argument is invalid */
    TSR_ERR_MISSING,     /* a required tensor, key or file is absent */
    TSR_ERR_INTERNAL,    /* an invariant broke: a bug in tessera */
    TSR_ERR_BUSY,        /* a queue or pool is full right now; retrying later may succeed */
    TSR_ERR_REMOTE       /* another rank failed, died or timed out */
} tsr_status;

/* Name of a status code, e.g. "format error". Never NULL. */
const char *tsr_status_str(tsr_status s);

/* Records a printf-style message for this thread and returns s, so callers can `return tsr_fail(...)`. */
tsr_status tsr_fail(tsr_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepends "context: " to this thread's message (keeps the existing text) and returns s. */
tsr_status tsr_fail_context(tsr_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The message recorded by the last tsr_fail on this thread ("" if none). Valid until the next tsr_fail. */
const char *tsr_last_error(void);

/* Clears this thread's message. */
void tsr_clear_error(void);

#define TSR_TRY(expr)                                                                                              \
    do {                                                                                                           \
        tsr_status tsr_try_status_ = (expr);                                                                       \
        if (tsr_try_status_ != TSR_OK) return tsr_try_status_;                                                     \
    } while (0)

#endif
