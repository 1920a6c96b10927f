/* Thread-local error messages behind tsr_status (see status.h). */
#include "runtime/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define TSR_ERROR_CAP 1024

static _Thread_local char last_error[TSR_ERROR_CAP];

const char *tsr_status_str(tsr_status s)
{
    switch (s) {
    case TSR_OK: return "ok";
    case TSR_ERR_IO: return "I/O error";
    case TSR_ERR_FORMAT: return "format error";
    case TSR_ERR_UNSUPPORTED: return "unsupported";
    case TSR_ERR_NOMEM: return "out of memory";
    case TSR_ERR_ARG: return "invalid argument";
    case TSR_ERR_MISSING: return "missing";
    case TSR_ERR_INTERNAL: return "internal error";
    case TSR_ERR_BUSY: return "busy";
    case TSR_ERR_REMOTE: return "remote rank failed";
    }
    return "unknown status";
}

tsr_status tsr_fail(tsr_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return s;
}

tsr_status tsr_fail_context(tsr_status s, const char *fmt, ...)
{
    char prefix[TSR_ERROR_CAP];
    char old[TSR_ERROR_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, last_error, sizeof old);
    size_t n = strlen(prefix);
    if (n > TSR_ERROR_CAP - 3) n = TSR_ERROR_CAP - 3;
    memcpy(last_error, prefix, n);
    memcpy(last_error + n, ": ", 2);
    size_t rest = strlen(old);
    if (rest > TSR_ERROR_CAP - 3 - n) rest = TSR_ERROR_CAP - 3 - n;
    memcpy(last_error + n + 2, old, rest);
    last_error[n + 2 + rest] = '\0';
    return s;
}

const char *tsr_last_error(void) { return last_error; }

void tsr_clear_error(void) { last_error[0] = '\0'; }
