/* tessera synth: writes a random EXL2 or GPTQ model of any geometry (for benchmarks and tests; see
 * runtime/synth.h).
 *
 * The default output is a structurally valid EXL2 model directory (config.json with quantization_config,
 * generation_config.json, output.safetensors or output-0000i-of-0000N.safetensors shards) whose decoder layers
 * average the requested bits per weight. With --format gptq every decoder linear layer is a 4-bit GPTQ layer
 * (v1 checkpoint format, --group-size rows per group, --act-order for a desc_act g_idx, --sym for zero points
 * of 8) and lm_head is fp16, in model.safetensors or model-0000i-of-0000N shards with an index. It streams, so
 * models larger than memory can be written. Same --seed, same bytes. Options of the other format are usage
 * errors. Exit codes: 0 ok, 1 failure (message on stderr), 2 usage error. */
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
            "                     [--seed S] [--max-pos 4096] [--shard-size MB] [--threads N] [--quiet]\n"
            "                     [--format exl2|gptq] [--group-size 128] [--act-order] [--sym]\n"
            "Writes a random quantized model (random codes, scales, zero points and permutations; not a trained\n"
            "model).\n"
            "  --format F      exl2 (default) or gptq: 4-bit GPTQ decoder layers (v1 checkpoint format), fp16 lm_head\n"
            "  --bpw B         EXL2: average bits per weight of the decoder layers' linear layers (default 4.0)\n"
            "  --head-bits     EXL2: lm_head option of the converter: 2, 3, 4, 5, 6 or 8 (default 6)\n"
            "  --group-size G  GPTQ: rows per group, a power of two 8..65536, or -1 for one group (default 128);\n"
            "                  EXL2: 32, 64 or 128 rows per group at every width but the 8-bit top slice\n"
            "                  (default: 32 or 64 for the higher width, 64 or 128 for the lower, per matrix)\n"
            "  --act-order     GPTQ: desc_act checkpoint (g_idx assigns rows to groups in a random order)\n"
            "  --sym           GPTQ: symmetric (every zero point 8; default: random zero points 6..10)\n"
            "  --head-dim D    default hidden / heads\n"
            "  --max-pos N     max_position_embeddings (default 4096): the longest context the model accepts, so\n"
            "                  benchmarks of longer prompts need it raised (32K prompts: 33280)\n"
            "  --shard-size MB split into output-0000i-of-0000N.safetensors files of at most MB MiB of tensors\n"
            "                  (GPTQ: model-0000i-of-0000N.safetensors and model.safetensors.index.json;\n"
            "                  default: one output.safetensors, or model.safetensors for GPTQ)\n"
            "  --threads N     shards written at once (default: one per core); the files are the same for any N\n");
}

int tsr_cmd_synth(int argc, char **argv)
{
    tsr_synth_opts o = {.arch = TSR_ARCH_LLAMA, .bpw = 4.0, .head_bits = 6, .seed = 0, .max_pos = 4096, .verbose = 1};
    const char *out = NULL, *arch = NULL;
    long hidden = 0, layers = 0, heads = 0, kv = 0, inter = 0, vocab = 0, head_dim = 0, head_bits = 6, seed = 0;
    long max_pos = 4096, shard_mb = 0, group_size = 0, threads = 0;
    int group_set = 0;
    double bpw = 4.0;
    const char *format = "exl2", *exl2_opt = NULL, *gptq_opt = NULL; /* the last option of each format given */
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
        } else if (!strcmp(a, "--format")) {
            if (!(format = tsr_cli_value("synth", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--bpw")) {
            if (!(v = tsr_cli_value("synth", argc, argv, &i)) || tsr_cli_float("synth", "--bpw", v, 2.0, 8.5, &bpw))
                return 2;
            exl2_opt = a;
        } else if (!strcmp(a, "--group-size")) {
            if (!(v = tsr_cli_value("synth", argc, argv, &i)) ||
                tsr_cli_int("synth", "--group-size", v, -1, 65536, &group_size))
                return 2;
            group_set = 1;
        } else if (!strcmp(a, "--act-order")) {
            o.act_order = 1;
            gptq_opt = a;
        } else if (!strcmp(a, "--sym")) {
            o.sym = 1;
            gptq_opt = a;
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
        else if (!strcmp(a, "--head-bits"))
        {
            if (!(v = tsr_cli_value("synth", argc, argv, &i)) || tsr_cli_int("synth", a, v, 2, 8, &head_bits)) return 2;
            exl2_opt = a;
        }
        INTOPT("--seed", seed, 0, 0x7fffffffffffffffL)
        INTOPT("--max-pos", max_pos, 1, 1L << 24)
        INTOPT("--shard-size", shard_mb, 1, 1L << 30)
        INTOPT("--threads", threads, 1, 1024)
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
    if (!strcmp(format, "gptq")) {
        o.format = TSR_SYNTH_GPTQ;
        if (exl2_opt) {
            fprintf(stderr,
                    "tessera synth: %s is an EXL2 option; --format gptq writes 4-bit layers and an fp16 lm_head\n",
                    exl2_opt);
            return 2;
        }
        const int pow2 = group_size >= 8 && !(group_size & (group_size - 1));
        if (group_set && group_size != -1 && !pow2) {
            fprintf(stderr,
                    "tessera synth: --group-size %ld: use a power of two from 8 to 65536, or -1 for one group "
                    "per matrix\n",
                    group_size);
            return 2;
        }
    } else if (!strcmp(format, "exl2")) {
        if (gptq_opt) {
            fprintf(stderr, "tessera synth: %s is a GPTQ option; add --format gptq\n", gptq_opt);
            return 2;
        }
        if (group_set && group_size != 32 && group_size != 64 && group_size != 128) {
            fprintf(stderr, "tessera synth: --group-size %ld: EXL2 groups are 32, 64 or 128 rows (the converter's)\n",
                    group_size);
            return 2;
        }
    } else {
        fprintf(stderr, "tessera synth: --format must be exl2 or gptq\n");
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
    o.group_size = (int)group_size;
    o.seed = (uint64_t)seed;
    o.max_pos = (int)max_pos;
    o.shard_bytes = (uint64_t)shard_mb << 20;
    o.threads = (int)threads;
    if (!head_dim && hidden % heads) {
        fprintf(stderr, "tessera synth: --hidden %ld is not a multiple of --heads %ld; give --head-dim\n", hidden,
                heads);
        return 2;
    }

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    tsr_synth_result r;
    tsr_status st = tsr_synth_write(&o, out, &r);
    if (st != TSR_OK) return tsr_cli_error("synth", st);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (o.verbose && o.format == TSR_SYNTH_GPTQ) {
        char gs[32];
        snprintf(gs, sizeof gs, "%d", o.group_size ? o.group_size : 128);
        printf("wrote %s: %d file(s), %.3f GB, GPTQ 4-bit, group size %s%s%s, decoder layers %.3f bpw, lm_head fp16, "
               "%.1f s\n",
               out, r.n_files, (double)r.total_bytes / 1e9, o.group_size == -1 ? "-1 (one group)" : gs,
               o.act_order ? ", act-order" : "", o.sym ? ", sym" : "", r.layers_bpw, secs);
    } else if (o.verbose) {
        printf("wrote %s: %d file(s), %.3f GB, decoder layers %.3f bpw (target %.3f), lm_head %.3f bpw, %.1f s\n", out,
               r.n_files, (double)r.total_bytes / 1e9, r.layers_bpw, o.bpw, r.head_bpw, secs);
    }
    return 0;
}
