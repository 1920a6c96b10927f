/* The CPU backend's operation table (see kernels/ops.h). */
#include "kernels/cpu/cpu_kernels.h"

static const tsr_ops cpu_ops = {
    .name = "cpu",
    .embed = tsr_cpu_embed,
    .rmsnorm = tsr_cpu_rmsnorm,
    .linear = tsr_cpu_linear,
    .rope = tsr_cpu_rope,
    .kv_store = tsr_cpu_kv_store,
    .attention = tsr_cpu_attention,
    .silu_mul = tsr_cpu_silu_mul,
    .add = tsr_cpu_add,
};

const tsr_ops *tsr_ops_cpu(void) { return &cpu_ops; }
