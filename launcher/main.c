/* Entry point of the `tessera` command: dispatches to one subcommand per file (cmd_*.c). */
#include "launcher/commands.h"

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
};

static void usage(FILE *out)
{
    fprintf(out, "usage: tessera <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n`tessera <command> --help` describes a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "tessera: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
