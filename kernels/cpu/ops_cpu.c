/* The CPU backend's operation table (see kernels/ops.h): host memory, weights used in place. */
#include "kernels/cpu/cpu_kernels.h"

#include <stdlib.h>
#include <string.h>

static void *cpu_alloc(size_t bytes) { return calloc(1, bytes ? bytes : 1); }
static void cpu_release(void *p) { free(p); }
static void cpu_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes) memmove(dst, src, bytes);
}
static void cpu_run_cached(uint64_t key, void (*fn)(void *ctx), void *ctx)
{
    (void)key;
    fn(ctx);
}
static size_t cpu_memory_free(void) { return 0; }
static tsr_status cpu_prepare_model(struct tsr_model *m)
{
    (void)m;
    return TSR_OK;
}
static void cpu_release_model(struct tsr_model *m) { (void)m; }

static const tsr_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .release = cpu_release,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .run_cached = cpu_run_cached,
    .memory_free = cpu_memory_free,
    .prepare_model = cpu_prepare_model,
    .release_model = cpu_release_model,
    .embed = tsr_cpu_embed,
    .rmsnorm = tsr_cpu_rmsnorm,
    .linear = tsr_cpu_linear,
    .rope = tsr_cpu_rope,
    .kv_store = tsr_cpu_kv_store,
    .attention = tsr_cpu_attention,
    .silu_mul = tsr_cpu_silu_mul,
    .add = tsr_cpu_add,
    .gather_rows = tsr_cpu_gather_rows,
    .argmax_rows = tsr_cpu_argmax_rows,
};

/* TSR_CPU_TOP=1: the table with top_rows too, so that the CPU suite runs the candidates path of the step and of the
 * split stages (sampled rows reduced to candidates, undecided rows fetched) as a GPU does. */
const tsr_ops *tsr_ops_cpu(void)
{
    static tsr_ops with_top;
    static int mode = -1;
    if (mode < 0) {
        const char *v = getenv("TSR_CPU_TOP");
        mode = v && !strcmp(v, "1");
        with_top = cpu_ops;
        with_top.top_rows = tsr_cpu_top_rows;
    }
    return mode ? &with_top : &cpu_ops;
}
