/* tessera inspect: describes a model directory without running it: architecture and dimensions, the format and
 * bits per weight of every layer, total weight bytes, and the memory a given context length and batch would need
 * (weights + KV pool + activation workspace). With --plan it also prints how `mpirun -np N` would split the model
 * over its N-1 workers (parallel/plan.h): the same planner every multi-rank run uses before loading, with the
 * per-GPU cap of --gpu-memory, so a deployment can be checked on any machine. */
#include "launcher/cli.h"
#include "launcher/commands.h"
#include "parallel/plan.h"
#include "runtime/forward.h"
#include "runtime/kv_cache.h"
#include "runtime/model.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: tessera inspect --model DIR [--context N] [--batch B] [--kv-dtype f16|f32|q4|q6|q8] "
               "[--max-batch-tokens T]\n"
               "                       [--plan [--np N] [--split S] [--tp N] [--gpu-memory SIZE[,SIZE...]]\n"
               "                       [--kv-fraction F]]\n"
               "Memory is estimated for B sequences of N tokens each (default: max_position_embeddings, batch 1).\n"
               "--plan prints the split of `mpirun -np N` (N-1 workers; N = 1: one process): S is none, layers,\n"
               "layers:R1,R2,... or tensor; --gpu-memory caps each worker (GPU workers); without it memory is not\n"
               "limited and the KV pool holds B x N tokens. Under a cap and without --context the pool takes the\n"
               "--kv-fraction share (default 0.95) of what weights and workspace leave, as serve's would; with\n"
               "--context the plan serves sequences of up to N positions (serve's --max-context).\n");
}

static double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

static const char *rope_name(tsr_rope_type t)
{
    switch (t) {
    case TSR_ROPE_LINEAR: return "linear";
    case TSR_ROPE_DYNAMIC: return "dynamic";
    case TSR_ROPE_LLAMA3: return "llama3";
    case TSR_ROPE_YARN: return "yarn";
    default: return "default";
    }
}

static const char *arch_name(tsr_arch a)
{
    switch (a) {
    case TSR_ARCH_MISTRAL: return "mistral";
    case TSR_ARCH_QWEN2: return "qwen2";
    default: return "llama";
    }
}

/* bits per weight of a linear layer as stored */
static double linear_bpw(const tsr_linear *L)
{
    if (L->kind == TSR_LINEAR_EXL2) return tsr_qmatrix_bpw(&L->q);
    return 8.0 * (double)tsr_dtype_size(L->w.dtype);
}

int tsr_cmd_inspect(int argc, char **argv)
{
    const char *dir = NULL;
    long context = 0, batch = 1, max_tokens = TSR_STEP_TOKENS_DEFAULT, np = 1, tp = 0;
    double pin_fraction = 0; /* --kv-fraction */
    int plan = 0;
    const char *split = NULL, *gpu_memory = NULL;
    tsr_dtype kv_dtype = TSR_F16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--plan")) {
            plan = 1;
            continue;
        }
        if (!(v = tsr_cli_value("inspect", argc, argv, &i))) return 2;
        if (!strcmp(a, "--model"))
            dir = v;
        else if (!strcmp(a, "--context")) {
            if (tsr_cli_int("inspect", a, v, 1, 1L << 30, &context)) return 2;
        } else if (!strcmp(a, "--batch")) {
            if (tsr_cli_int("inspect", a, v, 1, 1 << 20, &batch)) return 2;
        } else if (!strcmp(a, "--max-batch-tokens")) {
            if (tsr_cli_int("inspect", a, v, 1, 1 << 20, &max_tokens)) return 2;
        } else if (!strcmp(a, "--np")) {
            if (tsr_cli_int("inspect", a, v, 1, TSR_PLAN_MAX + 1, &np)) return 2;
        } else if (!strcmp(a, "--tp")) {
            if (tsr_cli_int("inspect", a, v, 1, TSR_PLAN_MAX, &tp)) return 2;
        } else if (!strcmp(a, "--split")) {
            split = v;
        } else if (!strcmp(a, "--gpu-memory")) {
            gpu_memory = v;
        } else if (!strcmp(a, "--kv-dtype")) {
            if (tsr_cli_kv_dtype("inspect", v, &kv_dtype)) {
                return 2;
            }
        } else if (!strcmp(a, "--kv-fraction")) {
            if (tsr_cli_kv_fraction("inspect", v, &pin_fraction)) return 2;
        } else {
            fprintf(stderr, "tessera inspect: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!dir) {
        usage(stderr);
        return 2;
    }
    tsr_plan_input pin;
    memset(&pin, 0, sizeof pin);
    if (plan) {
        /* everything that can be checked without the model, first */
        pin.n_workers = np > 1 ? (int)np - 1 : 1;
        pin.tp = (int)tp;
        if (tsr_split_parse(split, &pin.split) != TSR_OK) {
            fprintf(stderr, "tessera inspect: %s\n", tsr_last_error());
            return 2;
        }
        if (gpu_memory) {
            uint64_t v[TSR_PLAN_MAX];
            int n = 0;
            if (tsr_sizes_parse(gpu_memory, v, TSR_PLAN_MAX, &n) != TSR_OK) {
                fprintf(stderr, "tessera inspect: --gpu-memory: %s\n", tsr_last_error());
                return 2;
            }
            if (n != 1 && n < pin.n_workers) {
                fprintf(stderr, "tessera inspect: --gpu-memory has %d values for %d workers\n", n, pin.n_workers);
                return 2;
            }
            for (int w = 0; w < pin.n_workers; w++) pin.capacity[w] = n == 1 ? v[0] : v[w];
            pin.gpu = 1;
        }
    }
    tsr_model *m;
    tsr_status st = tsr_model_load(dir, &m);
    if (st != TSR_OK) return tsr_cli_error("inspect", st);
    const tsr_model_config *c = &m->cfg;
    const int context_given = context != 0;
    if (!context) context = c->rope.max_pos;

    printf("model          %s\n", dir);
    printf("architecture   %s (%s)\n", c->arch_name, arch_name(c->arch));
    printf("format         %s\n", tsr_model_format(m));
    if (!strcmp(c->quant.method, "gptq"))
        printf("quantization   gptq %d-bit, group size %d%s%s\n", c->quant.bits, c->quant.group_size,
               c->quant.desc_act ? ", act-order" : "", c->quant.gptq_v2 ? ", gptq_v2 zeros" : "");
    printf("layers         %d\n", c->n_layers);
    printf("hidden         %d\n", c->hidden);
    printf("heads          %d query, %d key/value, head_dim %d\n", c->n_heads, c->n_kv_heads, c->head_dim);
    printf("intermediate   %d\n", c->intermediate);
    printf("vocabulary     %d\n", c->vocab_size);
    printf("rope           %s, theta %g, %d rotary dims, factor %g, max positions %d\n", rope_name(c->rope.type),
           c->rope.theta, c->rope.dim, c->rope.factor, c->rope.max_pos);
    if (c->sliding_window) printf("sliding window %d tokens\n", c->sliding_window);
    printf("tied head      %s\n", m->head.kind == TSR_LINEAR_DENSE && m->head.w.data == m->embed.data ? "yes" : "no");

    printf("\nbits per weight per layer (q k v o | gate up down | layer average)\n");
    uint64_t linear_bytes = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const tsr_layer *ly = &m->layers[l];
        const tsr_linear *all[] = {&ly->q, &ly->k, &ly->v, &ly->o, &ly->gate, &ly->up, &ly->down};
        double bits = 0, weights = 0;
        printf("  layer %3d ", l);
        for (int i = 0; i < 7; i++) {
            printf("%s%5.2f", i == 4 ? " |" : " ", linear_bpw(all[i]));
            uint64_t b = tsr_linear_bytes(all[i]);
            linear_bytes += b;
            bits += linear_bpw(all[i]) * all[i]->K * all[i]->N;
            weights += (double)all[i]->K * all[i]->N;
        }
        printf(" | %5.2f\n", bits / weights);
    }
    int tied = m->head.kind == TSR_LINEAR_DENSE && m->head.w.data == m->embed.data;
    printf("  head      %5.2f%s\n", linear_bpw(&m->head), tied ? " (the embedding)" : "");
    if (!tied) linear_bytes += tsr_linear_bytes(&m->head);

    uint64_t embed_bytes = (uint64_t)m->embed.rows * m->embed.cols * tsr_dtype_size(m->embed.dtype);
    double kv = (double)tsr_kv_bytes_per_token(c->n_layers, c->n_kv_heads, c->head_dim, kv_dtype) * context * batch;
    double per_tok = 4.0 * (3.0 * c->hidden + 2.0 * c->n_heads * c->head_dim + 2.0 * c->n_kv_heads * c->head_dim +
                            2.0 * c->intermediate + c->vocab_size);
    double work = per_tok * max_tokens;
    printf("\nweights        %.1f MiB in files (%.1f MiB linear layers, %.1f MiB embedding)\n",
           mib((double)m->file_bytes), mib((double)linear_bytes), mib((double)embed_bytes));
    printf("KV cache       %.1f MiB for %ld sequence(s) x %ld tokens (%s, %zu bytes per token)\n", mib(kv), batch,
           context, tsr_kv_dtype_name(kv_dtype),
           tsr_kv_bytes_per_token(c->n_layers, c->n_kv_heads, c->head_dim, kv_dtype));
    printf("workspace      %.1f MiB for %ld tokens per forward call\n", mib(work), max_tokens);
    printf("total          %.1f MiB\n", mib((double)m->file_bytes + kv + work));
    int rc = 0;
    if (plan) {
        tsr_plan p;
        pin.page_size = 16;
        pin.max_tokens = (int)max_tokens;
        pin.kv_dtype = kv_dtype;
        /* a cap sizes the pool by what fits unless a context was asked for */
        pin.kv_tokens = gpu_memory && !context_given ? 0 : context * batch;
        pin.kv_fraction = pin_fraction;
        pin.max_context = context_given ? context : 0;
        printf("\n");
        if ((st = tsr_plan_make(m, &pin, &p)) != TSR_OK) {
            rc = tsr_cli_error("inspect", st);
        } else {
            tsr_plan_print(stdout, &p, m);
        }
    }
    tsr_model_free(m);
    return rc;
}
