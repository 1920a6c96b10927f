/* `--config FILE`: INI files as a second spelling of command-line flags.
 *
 * Every key of the file is a flag without its dashes: `split = tensor` means `--split tensor`, `print-ids = true`
 * means `--print-ids` (true/yes/on give the bare flag, false/no/off leave it out). Sections group keys for people
 * ([model], [parallel], [sampling], ...) and do not change their meaning, except that a section named after a
 * command ([generate], [serve], ...) applies only when that command runs. The file's flags take the place of the
 * `--config FILE` argument, so flags after it on the command line win (the commands keep the last value given).
 * A file that cannot be read or parsed is an error naming the file and line. */
#ifndef TSR_PARALLEL_CONFIG_INI_H
#define TSR_PARALLEL_CONFIG_INI_H

#include "runtime/status.h"

/* argv[0] is the command name. commands lists every command name (to recognize command sections). On success
 * *out_argv is a new malloc'd argv (its strings too; free with tsr_config_free) or argv itself when there is no
 * --config. */
tsr_status tsr_config_expand(int argc, char **argv, const char *const *commands, int n_commands, int *out_argc,
                             char ***out_argv);
void tsr_config_free(int argc, char **argv, char **orig);

#endif
