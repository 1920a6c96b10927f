/* --config FILE expansion with inih (see config_ini.h). */
#include "parallel/config_ini.h"

#include <ini.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct {
    const char *cmd;
    const char *const *commands;
    int n_commands;
    char **out;
    int n, cap;
    int failed;
    char bad[256];
} expand_ctx;

static int push(expand_ctx *c, const char *s, size_t len)
{
    if (c->n + 1 >= c->cap) {
        int cap = c->cap ? c->cap * 2 : 32;
        char **g = realloc(c->out, (size_t)cap * sizeof *g);
        if (!g) return 0;
        c->out = g;
        c->cap = cap;
    }
    char *d = malloc(len + 1);
    if (!d) return 0;
    memcpy(d, s, len);
    d[len] = '\0';
    c->out[c->n++] = d;
    c->out[c->n] = NULL;
    return 1;
}

static int is_command(const expand_ctx *c, const char *name)
{
    for (int i = 0; i < c->n_commands; i++)
        if (!strcmp(c->commands[i], name)) return 1;
    return 0;
}

static int on_entry(void *user, const char *section, const char *name, const char *value)
{
    expand_ctx *c = user;
    if (section && *section && is_command(c, section) && strcmp(section, c->cmd)) return 1; /* another command's */
    if (!strcmp(name, "config")) {
        snprintf(c->bad, sizeof c->bad, "'config' inside a config file");
        c->failed = 1;
        return 0;
    }
    char flag[160];
    snprintf(flag, sizeof flag, "--%s", name);
    if (!strcasecmp(value, "false") || !strcasecmp(value, "no") || !strcasecmp(value, "off")) return 1;
    if (!push(c, flag, strlen(flag))) return 0;
    if (!strcasecmp(value, "true") || !strcasecmp(value, "yes") || !strcasecmp(value, "on")) return 1;
    return push(c, value, strlen(value));
}

void tsr_config_free(int argc, char **argv, char **orig)
{
    if (!argv || argv == orig) return;
    for (int i = 0; i < argc; i++)
        free(argv[i]);
    free(argv);
}

tsr_status tsr_config_expand(int argc, char **argv, const char *const *commands, int n_commands, int *out_argc,
                             char ***out_argv)
{
    int any = 0;
    for (int i = 1; i < argc; i++)
        any |= !strcmp(argv[i], "--config");
    *out_argc = argc;
    *out_argv = argv;
    if (!any) return TSR_OK;
    expand_ctx c = {argv[0], commands, n_commands, NULL, 0, 0, 0, ""};
    tsr_status st = TSR_OK;
    if (!push(&c, argv[0], strlen(argv[0]))) st = tsr_fail(TSR_ERR_NOMEM, "out of memory");
    for (int i = 1; st == TSR_OK && i < argc; i++) {
        if (strcmp(argv[i], "--config")) {
            if (!push(&c, argv[i], strlen(argv[i]))) st = tsr_fail(TSR_ERR_NOMEM, "out of memory");
            continue;
        }
        if (i + 1 >= argc) {
            st = tsr_fail(TSR_ERR_ARG, "--config needs a file");
            break;
        }
        const char *file = argv[++i];
        int line = ini_parse(file, on_entry, &c);
        if (line < 0)
            st = tsr_fail(TSR_ERR_IO, "--config %s: cannot read the file", file);
        else if (c.failed)
            st = tsr_fail(TSR_ERR_FORMAT, "--config %s: %s", file, c.bad);
        else if (line > 0)
            st = tsr_fail(TSR_ERR_FORMAT, "--config %s: line %d is not 'key = value' or '[section]'", file, line);
    }
    if (st != TSR_OK) {
        tsr_config_free(c.n, c.out, NULL);
        return st;
    }
    *out_argc = c.n;
    *out_argv = c.out;
    return TSR_OK;
}
