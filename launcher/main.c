/* Entry point of the `tessera` command: dispatches to one subcommand per file (cmd_*.c).
 *
 * Under mpirun every rank runs this: MPI starts first (parallel/rank.h; only when an MPI launcher started the
 * process), `--config FILE` arguments are expanded into flags (parallel/config_ini.h), and the command runs on every
 * rank, rank 0 as the coordinator and the others as workers (parallel/session.h). Commands that do not run over
 * several ranks refuse a multi-rank job. MPI ends (or the job is aborted, after a rank failed) when the command
 * returns. */
#include "launcher/commands.h"
#include "parallel/config_ini.h"
#include "parallel/rank.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"generate", tsr_cmd_generate, "generate a continuation of a prompt"},
    {"logits", tsr_cmd_logits, "write the logits of prompts to a safetensors file"},
    {"inspect", tsr_cmd_inspect, "describe a model: dimensions, bits per weight, memory needs"},
    {"synth", tsr_cmd_synth, "write a random EXL2 model of any shape (for benchmarks)"},
    {"bench", tsr_cmd_bench, "measure prefill and decode speed and memory"},
    {"tokenize", tsr_cmd_tokenize, "encode and decode strings with a tokenizer.json"},
    {"template", tsr_cmd_template, "render a chat template for a conversation"},
    {"serve", tsr_cmd_serve, "serve the model over an OpenAI-compatible HTTP API"},
    {"batch", tsr_cmd_batch, "run an OpenAI batch file (JSONL) through the model, resumably"},
    {"intake", tsr_cmd_intake, "serve a model on a nanomsg address (docs/intake.md)"},
    {"submit", tsr_cmd_submit, "send a request to a nanomsg intake and print the reply"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: tessera <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n`tessera <command> --help` describes a command's options.\n");
}

/* Commands that drive their model through a session (parallel/session.h) and so run over several ranks. */
static const char *const multi_rank[] = {"generate", "logits", "bench", "batch", "intake", "serve"};

static int run_command(const command *c, int argc, char **argv)
{
    const char *names[sizeof commands / sizeof commands[0]];
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) names[i] = commands[i].name;
    int n = 0;
    char **v = NULL;
    tsr_status st = tsr_config_expand(argc, argv, names, (int)(sizeof names / sizeof names[0]), &n, &v);
    if (st != TSR_OK) {
        if (!tsr_rank_is_worker()) fprintf(stderr, "tessera %s: %s\n", c->name, tsr_last_error());
        return 2;
    }
    int ok = !tsr_rank_multi();
    for (size_t i = 0; i < sizeof multi_rank / sizeof multi_rank[0]; i++) ok |= !strcmp(c->name, multi_rank[i]);
    int rc = 2;
    if (ok)
        rc = c->run(n, v);
    else if (!tsr_rank_is_worker())
        fprintf(stderr, "tessera %s: this command runs in one process; start it without mpirun (or with -np 1)\n",
                c->name);
    tsr_config_free(n, v, argv);
    return rc;
}

int main(int argc, char **argv)
{
    if (tsr_rank_init(&argc, &argv) != TSR_OK) {
        fprintf(stderr, "tessera: %s\n", tsr_last_error());
        return tsr_rank_finalize(1);
    }
    if (argc < 2) {
        usage(stderr);
        return tsr_rank_finalize(2);
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return tsr_rank_finalize(0);
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return tsr_rank_finalize(run_command(&commands[i], argc - 1, argv + 1));
    fprintf(stderr, "tessera: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return tsr_rank_finalize(2);
}
