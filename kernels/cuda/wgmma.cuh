/* Hopper's warpgroup tensor-core instructions (wgmma, sm_90a only), as thin inline-PTX wrappers for the prefill
 * attention (attention_prefill_wgmma.cu) and the EXL2/GPTQ prefill product (gemm_dq_wgmma.cu).
 *
 * A warpgroup is four consecutive warps (128 threads) that issue each wgmma together. D (fp32) is 64 rows × N
 * columns spread over the warpgroup as the mma.m16n8k16 C fragments of its four warps stacked: warp w holds rows
 * 16 w .. 16 w + 15, and d[4 j + i] of lane l is row 16 w + l / 4 + 8 (i / 2), column 8 j + 2 (l % 4) + i % 2. An A
 * operand from registers has the same per-warp layout as mma.m16n8k16's A. Operands in shared memory are named by
 * a 64-bit descriptor (wg_desc) and laid out in the 128-byte swizzle: rows of 128 bytes (64 fp16), eight rows form a
 * 1024-byte atom (the start of a tile must be 1024-byte aligned), and the 16-byte chunk c of row r sits at chunk
 * c ^ (r % 8) of that row (wg_swz gives the byte offset). A row longer than 64 halves continues in a second block of
 * atoms `lead` bytes further.
 *   K-major operand (rows = M or N, contiguous = K; Q and K here): the descriptor of k-step s (16 halves) starts at
 *   the tile + (s / 4) · lead + (s % 4) · 32; the stride between eight-row groups is 1024 bytes.
 *   MN-major operand (rows = K, contiguous = N; V here, with the instruction's transpose flag): the descriptor of
 *   k-step s starts at the tile + s · 2048 (two eight-row groups); the next 64 columns of N are `lead` bytes further.
 * Order of use: writes to shared memory by ordinary stores or cp.async must be followed by wg_fence_smem() in the
 * writing threads and a barrier before a wgmma reads them; a batch of wgmma's is wg_arrive(), the mma's,
 * wg_commit(), and wg_wait<0>() before their accumulators are read (wg_keep() then stops the compiler from moving
 * reads of them above the wait). PTX ISA: "Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions". */
#ifndef TSR_CUDA_WGMMA_CUH
#define TSR_CUDA_WGMMA_CUH

#include <stdint.h>

/* Byte offset of 16-byte chunk c (of D / 8) of row r in a tile of `rows` rows in the 128-byte swizzle: chunks 0-7
 * in the first block of atoms, 8-15 in the second, rows · 128 bytes further. */
__device__ __forceinline__ uint32_t wg_swz(int r, int c, int rows)
{
    return (uint32_t)((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

/* Descriptor of a 128-byte-swizzled operand at shared address `addr`: `lead` the leading-dimension byte offset (the
 * next 64 columns of an MN-major operand; unused for K-major), 1024 the stride between eight-row groups. */
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lead)
{
    return (uint64_t)((addr & 0x3ffff) >> 4) | (uint64_t)((lead & 0x3ffff) >> 4) << 16 | (uint64_t)(1024 >> 4) << 32 |
           1ull << 62;
}

/* Descriptor of an operand without swizzle (8 × 16-byte core matrices of 128 contiguous bytes): `lead` bytes between
 * the core matrices along K, `stride` bytes between those along M or N. */
__device__ __forceinline__ uint64_t wg_desc_plain(uint32_t addr, uint32_t lead, uint32_t stride)
{
    return (uint64_t)((addr & 0x3ffff) >> 4) | (uint64_t)((lead & 0x3ffff) >> 4) << 16 |
           (uint64_t)((stride & 0x3ffff) >> 4) << 32;
}

__device__ __forceinline__ void wg_fence_smem(void) { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wg_arrive(void) { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
/* Waits until at most N of the warpgroup's committed batches are still running (they finish in order). */
template <int N> __device__ __forceinline__ void wg_wait(void)
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* An empty asm that takes and gives back each accumulator, so no read of them moves above the wait before it. */
template <int N> __device__ __forceinline__ void wg_keep(float (&d)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* D (64 × N) = A · B (+ D where accumulate != 0), A and B K-major in shared memory. */
__device__ __forceinline__ void wg_mma_ss64(float (&d)[32], uint64_t a, uint64_t b, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
                 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                   "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
                   "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
                   "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(a), "l"(b), "r"(accumulate));
}

/* The accumulator operands of m64nN wgmma's (inline-PTX operands %0 on), 16 registers (32 rows of B) a chunk, and
 * their place in the instruction's text: WG_D<R>(d) and WG_D<R>_TEXT for R = N / 2 registers. */
#define WG_DC0(d) \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), \
    "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), \
    "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define WG_DC0_TEXT "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
#define WG_DC16(d) \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), \
    "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
    "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define WG_DC16_TEXT "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define WG_DC32(d) \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), \
    "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), \
    "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
#define WG_DC32_TEXT "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47"
#define WG_DC48(d) \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), \
    "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), \
    "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define WG_DC48_TEXT "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define WG_DC64(d) \
    "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), \
    "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), \
    "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79])
#define WG_DC64_TEXT "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79"
#define WG_DC80(d) \
    "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), \
    "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), \
    "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
#define WG_DC80_TEXT "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95"
#define WG_DC96(d) \
    "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), \
    "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), \
    "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111])
#define WG_DC96_TEXT "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111"
#define WG_DC112(d) \
    "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), \
    "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), \
    "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define WG_DC112_TEXT "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
#define WG_D48(d) WG_DC0(d), WG_DC16(d), WG_DC32(d)
#define WG_D48_TEXT WG_DC0_TEXT "," WG_DC16_TEXT "," WG_DC32_TEXT
#define WG_D64(d) WG_D48(d), WG_DC48(d)
#define WG_D64_TEXT WG_D48_TEXT "," WG_DC48_TEXT
#define WG_D80(d) WG_D64(d), WG_DC64(d)
#define WG_D80_TEXT WG_D64_TEXT "," WG_DC64_TEXT
#define WG_D96(d) WG_D80(d), WG_DC80(d)
#define WG_D96_TEXT WG_D80_TEXT "," WG_DC80_TEXT
#define WG_D112(d) WG_D96(d), WG_DC96(d)
#define WG_D112_TEXT WG_D96_TEXT "," WG_DC96_TEXT
#define WG_D128(d) WG_D112(d), WG_DC112(d)
#define WG_D128_TEXT WG_D112_TEXT "," WG_DC112_TEXT

__device__ __forceinline__ void wg_mma_ss128(float (&d)[64], uint64_t a, uint64_t b, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
                 WG_D64_TEXT
                 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : WG_D64(d)
                 : "l"(a), "l"(b), "r"(accumulate));
}

/* D (64 × N) += A · B, A (64 × 16) from registers, B MN-major in shared memory (transposed by the instruction). */
__device__ __forceinline__ void wg_mma_rs64(float (&d)[32], const uint32_t (&a)[4], uint64_t b, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
                 "}, {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                   "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
                   "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
                   "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

/* D (64 × 8) += A · B, A from registers, B K-major in shared memory (16 × 8, wg_desc_plain). */
__device__ __forceinline__ void wg_mma_rs8(float (&d)[4], const uint32_t (&a)[4], uint64_t b)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

__device__ __forceinline__ void wg_mma_rs128(float (&d)[64], const uint32_t (&a)[4], uint64_t b, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
                 WG_D64_TEXT
                 "}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
                 : WG_D64(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

/* D (64 × N) += A · B, A from registers, B K-major in shared memory: the products of gemm_dq_wgmma.cu's tiles of N
 * activation rows (96-256). WG_RS_K defines wg_mma_rs<N>k with REGS = N / 2 accumulators, whose operand and text
 * macros are D and D##_TEXT (above); A0-A3 and B are the operand numbers of the A registers and B's descriptor. */
#define WG_RS_K(N, REGS, D, A0, A1, A2, A3, B)                                                                      \
    __device__ __forceinline__ void wg_mma_rs##N##k(float (&d)[REGS], const uint32_t (&a)[4], uint64_t b)          \
    {                                                                                                              \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                     \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.f16.f16 {" D##_TEXT "}, {%" #A0 ",%" #A1     \
                     ",%" #A2 ",%" #A3 "}, %" #B ", p, 1, 1, 0;\n}\n"                                             \
                     : D(d)                                                                                        \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));                                       \
    }
WG_RS_K(96, 48, WG_D48, 48, 49, 50, 51, 52)
WG_RS_K(128, 64, WG_D64, 64, 65, 66, 67, 68)
WG_RS_K(160, 80, WG_D80, 80, 81, 82, 83, 84)
WG_RS_K(192, 96, WG_D96, 96, 97, 98, 99, 100)
WG_RS_K(224, 112, WG_D112, 112, 113, 114, 115, 116)
WG_RS_K(256, 128, WG_D128, 128, 129, 130, 131, 132)
#endif

#endif
