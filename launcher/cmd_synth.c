/* tessera synth: writes a random EXL2 model of any geometry (for benchmarks and tests; see runtime/synth.h).
 *
 * The output is a structurally valid EXL2 model directory (config.json with quantization_config,
 * generation_config.json, output.safetensors or output-0000i-of-0000N.safetensors shards) whose decoder layers
 * average the requested bits per weight. It streams, so models larger than memory can be written. Same --seed,
 * same bytes. Exit codes: 0 ok, 1 failure (message on stderr), 2 usage error. */
#include "launcher/cli.h"
#include "launcher/commands.h"
#include "runtime/synth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tessera synth --arch llama|mistral|qwen2 --hidden H --layers L --heads NH --kv-heads NKV\n"
            "                     --intermediate I --vocab V --out DIR [--head-dim D] [--bpw B] [--head-bits 6]\n"
            "                     [--seed S] [--max-pos 4096] [--shard-size MB] [--quiet]\n"
            "Writes a random EXL2 model (random codes, scales and permutations; not a trained model).\n"
            "  --bpw B         average bits per weight of the decoder layers' linear layers (default 4.0)\n"
            "  --head-bits     lm_head option of the converter: 2, 3, 4, 5, 6 or 8 (default 6)\n"
            "  --head-dim D    default hidden / heads\n"
            "  --shard-size MB split into output-0000i-of-0000N.safetensors files of at most MB MiB of tensors\n"
            "                  (default: one output.safetensors)\n");
}

int tsr_cmd_synth(int argc, char **argv)
{
    tsr_synth_opts o = {.arch = TSR_ARCH_LLAMA, .bpw = 4.0, .head_bits = 6, .seed = 0, .max_pos = 4096, .verbose = 1};
    const char *out = NULL, *arch = NULL;
    long hidden = 0, layers = 0, heads = 0, kv = 0, inter = 0, vocab = 0, head_dim = 0, head_bits = 6, seed = 0;
    long max_pos = 4096, shard_mb = 0;
    double bpw = 4.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
#define INTOPT(flag, var, lo, hi)                                                                                  \
    else if (!strcmp(a, flag))                                                                                     \
    {                                                                                                              \
        if (!(v = tsr_cli_value("synth", argc, argv, &i)) || tsr_cli_int("synth", flag, v, lo, hi, &var)) return 2; \
    }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--out")) {
            if (!(out = tsr_cli_value("synth", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--arch")) {
            if (!(arch = tsr_cli_value("synth", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--bpw")) {
            if (!(v = tsr_cli_value("synth", argc, argv, &i)) || tsr_cli_float("synth", "--bpw", v, 2.0, 8.5, &bpw))
                return 2;
        } else if (!strcmp(a, "--quiet")) {
            o.verbose = 0;
        }
        INTOPT("--hidden", hidden, 1, 65535)
        INTOPT("--layers", layers, 1, 100000)
        INTOPT("--heads", heads, 1, 65535)
        INTOPT("--kv-heads", kv, 1, 65535)
        INTOPT("--intermediate", inter, 1, 65535)
        INTOPT("--vocab", vocab, 3, 1L << 24)
        INTOPT("--head-dim", head_dim, 2, 65535)
        INTOPT("--head-bits", head_bits, 2, 8)
        INTOPT("--seed", seed, 0, 0x7fffffffffffffffL)
        INTOPT("--max-pos", max_pos, 1, 1L << 24)
        INTOPT("--shard-size", shard_mb, 1, 1L << 30)
        else {
            fprintf(stderr, "tessera synth: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
#undef INTOPT
    }
    if (!out || !arch || !hidden || !layers || !heads || !kv || !inter || !vocab) {
        fprintf(stderr, "tessera synth: --arch, --hidden, --layers, --heads, --kv-heads, --intermediate, --vocab and "
                        "--out are required\n");
        usage(stderr);
        return 2;
    }
    if (!strcmp(arch, "llama"))
        o.arch = TSR_ARCH_LLAMA;
    else if (!strcmp(arch, "mistral"))
        o.arch = TSR_ARCH_MISTRAL;
    else if (!strcmp(arch, "qwen2"))
        o.arch = TSR_ARCH_QWEN2;
    else {
        fprintf(stderr, "tessera synth: --arch must be llama, mistral or qwen2\n");
        return 2;
    }
    o.hidden = (int)hidden;
    o.layers = (int)layers;
    o.heads = (int)heads;
    o.kv_heads = (int)kv;
    o.intermediate = (int)inter;
    o.vocab = (int)vocab;
    o.head_dim = head_dim ? (int)head_dim : (int)(hidden / heads);
    o.head_bits = (int)head_bits;
    o.bpw = bpw;
    o.seed = (uint64_t)seed;
    o.max_pos = (int)max_pos;
    o.shard_bytes = (uint64_t)shard_mb << 20;
    if (!head_dim && hidden % heads) {
        fprintf(stderr, "tessera synth: --hidden %ld is not a multiple of --heads %ld; give --head-dim\n", hidden, heads);
        return 2;
    }

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    tsr_synth_result r;
    tsr_status st = tsr_synth_write(&o, out, &r);
    if (st != TSR_OK) return tsr_cli_error("synth", st);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (o.verbose)
        printf("wrote %s: %d file(s), %.3f GB, decoder layers %.3f bpw (target %.3f), lm_head %.3f bpw, %.1f s\n", out,
               r.n_files, (double)r.total_bytes / 1e9, r.layers_bpw, o.bpw, r.head_bpw, secs);
    return 0;
}
