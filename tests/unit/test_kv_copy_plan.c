/* The choice attention over a quantized KV cache makes between an fp16 copy of the batch's context and per-row
 * rebuilds in the decode kernel (kernels/kv_copy_plan.c, followed by kernels/cuda/attention_kvq.cu), on batches
 * shaped as the scheduler plans them: a long prompt's later chunks (copy: the decode kernel would rebuild the context
 * once per row), decode rows alone (no copy: each position serves one row), decode rows followed by a prompt chunk
 * (split: the decode rows to the decode kernel, the chunk over a copy of its own context), chunks followed by
 * decode rows (kept whole), the room the pool's sizing left, sliding windows (the copy from each sequence's window
 * start), and batches without host mirrors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "kernels/kv_copy_plan.h"

#define PAGE      16
#define MAX_SEQS  80
#define MAX_ROWS  4096
#define MAX_PAGES 4096

/* A batch as runtime/forward.c describes one: sequences of n[s] rows from position pos0[s]. */
typedef struct {
    tsr_batch_layout b;
    int32_t seq_row0[MAX_SEQS + 1], positions[MAX_ROWS], row_seq[MAX_ROWS];
} batch;

static int32_t tables[MAX_SEQS * MAX_PAGES]; /* only addressed, never read */

static void make_batch(batch *x, int n_seqs, const int *n, const int *pos0)
{
    int rows = 0, max_pos = 0;
    double attended = 0;
    for (int s = 0; s < n_seqs; s++) {
        x->seq_row0[s] = rows;
        for (int i = 0; i < n[s]; i++, rows++)
            x->positions[rows] = pos0[s] + i, x->row_seq[rows] = s;
        if (pos0[s] + n[s] - 1 > max_pos) max_pos = pos0[s] + n[s] - 1;
        attended += (double)n[s] * pos0[s] + (double)n[s] * (n[s] + 1) / 2;
    }
    x->seq_row0[n_seqs] = rows;
    x->b = (tsr_batch_layout){n_seqs, rows, MAX_PAGES, max_pos, x->row_seq, x->positions, x->seq_row0, tables, NULL,
                              NULL, attended, x->seq_row0, x->positions};
}

static tsr_kv_cache cache(int max_tokens, long max_context)
{
    tsr_kv_cache kv = {0};
    kv.dtype = TSR_KV_Q4, kv.page_size = PAGE;
    kv.expand_positions = tsr_kv_expand_positions(max_tokens, max_context, PAGE);
    return kv;
}

/* 64 decode rows at positions 30000 .. 30063 and a 2048-token chunk from position 0: the chunk last (as the
 * scheduler plans a step) or first. */
static void decode_rows_and_chunk(batch *x, int chunk_first)
{
    int n[65], pos0[65];
    for (int s = 0; s < 64; s++)
        n[s + chunk_first] = 1, pos0[s + chunk_first] = 30000 + s;
    const int c = chunk_first ? 0 : 64;
    n[c] = 2048, pos0[c] = 0;
    make_batch(x, 65, n, pos0);
}

/* A 32K-token prompt in 512-token chunks: every chunk is copied, up to the last (its rows would otherwise each
 * rebuild 31K positions). */
static void test_long_prompt_chunks_copy(void **state)
{
    (void)state;
    batch x;
    const tsr_kv_cache kv = cache(512, 32768);
    for (int pos0 = 0; pos0 < 32768; pos0 += 512) {
        make_batch(&x, 1, (int[]){512}, (int[]){pos0});
        assert_int_equal(tsr_kv_copy_pages(&x.b, 0, &kv), (pos0 + 512) / PAGE);
    }
    /* a 2048-token chunk at the end of a 64K context */
    const tsr_kv_cache big = cache(2048, 65536);
    make_batch(&x, 1, (int[]){2048}, (int[]){63488});
    assert_int_equal(tsr_kv_copy_pages(&x.b, 0, &big), 65536 / PAGE);
}

/* Decode rows alone: each rebuilt position would serve one row visit, so the decode kernel takes them, whole. */
static void test_decode_rows_stay_with_the_decode_kernel(void **state)
{
    (void)state;
    batch x, dec, rest;
    const tsr_kv_cache kv = cache(64, 32768);
    int n[8], pos0[8];
    for (int s = 0; s < 8; s++)
        n[s] = 1, pos0[s] = 1000 + 37 * s;
    make_batch(&x, 8, n, pos0);
    assert_int_equal(tsr_kv_copy_pages(&x.b, 0, &kv), 0);
    assert_int_equal(tsr_kv_copy_split(&x.b, 0, &kv, &dec.b, &rest.b), 0);
    /* a two-row chunk far into its context: its positions serve two visits each, not enough to pay for the copy */
    make_batch(&x, 1, (int[]){2}, (int[]){10000});
    assert_int_equal(tsr_kv_copy_pages(&x.b, 0, &kv), 0);
    /* but a 64-row chunk there pays */
    make_batch(&x, 1, (int[]){64}, (int[]){10000});
    assert_int_equal(tsr_kv_copy_pages(&x.b, 0, &kv), (10064 + PAGE - 1) / PAGE);
}

/* 64 decode rows at 30K positions beside a 2048-token chunk: the copy of all 65 sequences exceeds the room; the
 * decode rows go to the decode kernel and the chunk over a copy of its own context. */
static void test_decode_rows_then_a_chunk_split(void **state)
{
    (void)state;
    batch x;
    tsr_batch_layout dec, rest;
    const tsr_kv_cache kv = cache(2112, 32768);
    decode_rows_and_chunk(&x, 0);
    assert_int_equal(tsr_kv_copy_pages(&x.b, 0, &kv), 0);
    assert_int_equal(tsr_kv_copy_split(&x.b, 0, &kv, &dec, &rest), 64);
    assert_int_equal(dec.n_seqs, 64);
    assert_int_equal(dec.n_rows, 64);
    assert_int_equal(dec.max_position, 30063);
    assert_true(dec.row_seq == x.row_seq && dec.seq_row0 == x.seq_row0 && dec.page_tables == tables);
    assert_true(dec.attended == 64.0 * 30000 + 64.0 * 65 / 2);
    assert_int_equal(rest.n_seqs, 1);
    assert_int_equal(rest.n_rows, 2048);
    assert_int_equal(rest.max_position, 2047);
    assert_true(rest.attended == 2048.0 * 2049 / 2);
    /* sequence arrays offset; rows keep their numbers */
    assert_true(rest.seq_row0 == x.seq_row0 + 64 && rest.host_seq_row0 == x.seq_row0 + 64);
    assert_int_equal(rest.seq_row0[0], 64);
    assert_int_equal(rest.seq_row0[1], 64 + 2048);
    assert_true(rest.positions == x.positions && rest.host_positions == x.positions);
    assert_true(rest.page_tables == tables + 64 * MAX_PAGES);
    assert_null(rest.row_seq);
    assert_int_equal(tsr_kv_copy_pages(&rest, 0, &kv), 2048 / PAGE);
    /* the same with the chunk's own copy too large for the room: nothing to split */
    const tsr_kv_cache small = cache(32, 1024); /* room for 1024 positions */
    assert_int_equal(tsr_kv_copy_split(&x.b, 0, &small, &dec, &rest), 0);
}

/* Chunks before decode rows would need the decode kernel's rows offset: such batches stay whole. A batch whose two
 * long chunks together exceed the room is not split either (nothing leads with one-row sequences). */
static void test_chunks_first_stay_whole(void **state)
{
    (void)state;
    batch x;
    tsr_batch_layout dec, rest;
    const tsr_kv_cache kv = cache(2112, 32768);
    decode_rows_and_chunk(&x, 1);
    assert_int_equal(tsr_kv_copy_pages(&x.b, 0, &kv), 0);
    assert_int_equal(tsr_kv_copy_split(&x.b, 0, &kv, &dec, &rest), 0);
    const tsr_kv_cache k512 = cache(1024, 32768);
    make_batch(&x, 2, (int[]){512, 512}, (int[]){31744, 31744});
    assert_int_equal(tsr_kv_copy_pages(&x.b, 0, &k512), 0); /* 2 × 32256 positions > 32768 */
    assert_int_equal(tsr_kv_copy_split(&x.b, 0, &k512, &dec, &rest), 0);
}

/* The room: without the pool's figure, 32 positions per row of the step; a span past the page tables is refused. */
static void test_room_and_invalid_spans(void **state)
{
    (void)state;
    batch x;
    tsr_kv_cache kv = cache(0, 0);
    assert_int_equal(kv.expand_positions, 0);
    make_batch(&x, 1, (int[]){512}, (int[]){15872}); /* 16384 positions = 32 × 512 */
    assert_int_equal(tsr_kv_copy_pages(&x.b, 0, &kv), 16384 / PAGE);
    make_batch(&x, 1, (int[]){512}, (int[]){15873});
    assert_int_equal(tsr_kv_copy_pages(&x.b, 0, &kv), 0);
    /* positions past the page tables */
    kv = cache(512, 1 << 20);
    make_batch(&x, 1, (int[]){512}, (int[]){MAX_PAGES * PAGE - 256});
    assert_int_equal(tsr_kv_copy_pages(&x.b, 0, &kv), 0);
    /* where the forward did not count the visits (0), only the room decides */
    make_batch(&x, 1, (int[]){1}, (int[]){1000});
    x.b.attended = 0;
    assert_int_equal(tsr_kv_copy_pages(&x.b, 0, &kv), (1001 + PAGE - 1) / PAGE);
}

/* A sliding window: each sequence's copy starts at the page of its first row's window start, so a chunk deep into a
 * long context copies about window + chunk positions; each row's visits are capped at the window. Without host
 * mirrors the copy would hold the whole span, which then does not pay. */
static void test_window(void **state)
{
    (void)state;
    batch x;
    const tsr_kv_cache kv = cache(512, 32768);
    make_batch(&x, 1, (int[]){64}, (int[]){20000});
    assert_int_equal(tsr_kv_copy_pages(&x.b, 0, &kv), (20064 + PAGE - 1) / PAGE);
    /* rows 20000 .. 20063 with a window of 256: positions 19745 .. 20063, pages 1234 .. 1253 */
    assert_int_equal(tsr_kv_copy_first_page(20000, 256, PAGE), 19745 / PAGE);
    assert_int_equal(tsr_kv_copy_pages(&x.b, 256, &kv), 20063 / PAGE + 1 - 19745 / PAGE);
    /* the longest of several sequences' windowed spans */
    make_batch(&x, 2, (int[]){64, 400}, (int[]){20000, 100});
    assert_int_equal(tsr_kv_copy_pages(&x.b, 256, &kv), 499 / PAGE + 1); /* sequence 1 from page 0: 32 pages */
    assert_int_equal(tsr_kv_copy_first_page(100, 256, PAGE), 0);
    assert_int_equal(tsr_kv_copy_first_page(5, 0, PAGE), 0);
    make_batch(&x, 1, (int[]){64}, (int[]){20000});
    x.b.host_positions = NULL;
    assert_int_equal(tsr_kv_copy_window(&x.b, 256), 0);
    assert_int_equal(tsr_kv_copy_pages(&x.b, 256, &kv), 0);
    make_batch(&x, 1, (int[]){512}, (int[]){0});
    assert_int_equal(tsr_kv_copy_pages(&x.b, 256, &kv), 512 / PAGE);
}

/* Without host mirrors a batch cannot be split. */
static void test_no_mirrors_no_split(void **state)
{
    (void)state;
    batch x;
    tsr_batch_layout dec, rest;
    const tsr_kv_cache kv = cache(2112, 32768);
    decode_rows_and_chunk(&x, 0);
    assert_int_equal(tsr_kv_copy_split(&x.b, 0, &kv, &dec, &rest), 64);
    x.b.host_seq_row0 = NULL;
    assert_int_equal(tsr_kv_copy_split(&x.b, 0, &kv, &dec, &rest), 0);
    decode_rows_and_chunk(&x, 0);
    x.b.host_positions = NULL;
    assert_int_equal(tsr_kv_copy_split(&x.b, 0, &kv, &dec, &rest), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_long_prompt_chunks_copy),
        cmocka_unit_test(test_decode_rows_stay_with_the_decode_kernel),
        cmocka_unit_test(test_decode_rows_then_a_chunk_split),
        cmocka_unit_test(test_chunks_first_stay_whole),
        cmocka_unit_test(test_room_and_invalid_spans),
        cmocka_unit_test(test_window),
        cmocka_unit_test(test_no_mirrors_no_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
