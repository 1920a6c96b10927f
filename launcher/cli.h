/* Small helpers shared by the subcommands: strict number parsing, id lists, error reporting. */
#ifndef TSR_LAUNCHER_CLI_H
#define TSR_LAUNCHER_CLI_H

#include "runtime/dtype.h"
#include "runtime/status.h"

#include <stdint.h>

/* Parses a whole string as an integer in [lo, hi]; returns 0 on success, -1 (with a message on stderr naming
 * `what`) otherwise. */
int tsr_cli_int(const char *cmd, const char *what, const char *s, long lo, long hi, long *out);
int tsr_cli_float(const char *cmd, const char *what, const char *s, double lo, double hi, double *out);
/* Parses a --kv-dtype value ("f16"/"fp16" or "f32"/"fp32"); -1 with a message otherwise. */
int tsr_cli_kv_dtype(const char *cmd, const char *s, tsr_dtype *out);
/* Parses "1,2,3" into a malloc'd array. */
int tsr_cli_ids(const char *cmd, const char *s, int32_t **ids, int *n);
/* Parses a --kv-fraction value: a share in (0, 1]; -1 with a message otherwise. */
int tsr_cli_kv_fraction(const char *cmd, const char *s, double *out);
/* -1 with a message where both --kv-tokens and --kv-fraction were given (0 = not given), else 0. */
int tsr_cli_kv_size_check(const char *cmd, long kv_tokens, double kv_fraction);
/* Prints "tessera <cmd>: <status>: <last error>" to stderr and returns 1. */
int tsr_cli_error(const char *cmd, tsr_status st);
/* Value of option argv[*i] (advancing *i), or NULL with a usage message when it is missing. */
const char *tsr_cli_value(const char *cmd, int argc, char **argv, int *i);

#endif
