/* The choice between an fp16 copy of the context and per-row rebuilds for attention over a quantized KV cache: see
 * kv_copy_plan.h. Host arithmetic over the batch's host values; doubles, since Σ (position + 1) over a large batch
 * of long contexts passes 2^31. */
#include "kernels/kv_copy_plan.h"

int tsr_kv_copy_window(const tsr_batch_layout *b, int window)
{
    return window > 0 && b->host_seq_row0 && b->host_positions ? window : 0;
}

int tsr_kv_copy_pages(const tsr_batch_layout *b, int window, const tsr_kv_cache *kv)
{
    if (b->n_seqs <= 0 || b->n_rows <= 0 || kv->page_size <= 0) return 0;
    const int page = kv->page_size, span_pages = (b->max_position + page) / page;
    if (span_pages > b->max_pages) return 0; /* positions past the page tables: not a valid batch */
    /* under a window each sequence's copy starts at its first row's window start (tsr_kv_copy_first_page) */
    int copy_pages = span_pages;
    const int w = tsr_kv_copy_window(b, window);
    if (w > 0) {
        copy_pages = 0;
        for (int s = 0; s < b->n_seqs; s++) {
            const int r0 = b->host_seq_row0[s], r1 = b->host_seq_row0[s + 1];
            const int pages = b->host_positions[r1 - 1] / page + 1 -
                              tsr_kv_copy_first_page(b->host_positions[r0], w, page);
            if (pages > copy_pages) copy_pages = pages;
        }
    }
    const double copied = (double)b->n_seqs * copy_pages * page;
    const double room =
        kv->expand_positions > 0 ? (double)kv->expand_positions : TSR_KV_EXPAND_ROWS * (double)b->n_rows;
    if (copied > room) return 0;
    if (b->attended > 0) {
        double visits = b->attended;
        if (window > 0 && visits > (double)window * b->n_rows) visits = (double)window * b->n_rows;
        if (TSR_KV_COPY_MIN_VISITS * copied > visits) return 0;
    }
    return copy_pages;
}

/* Sequences [s_lo, s_hi) of b (from the host mirrors): their largest position and the positions their rows attend
 * to, into p. */
static void part_extent(const tsr_batch_layout *b, int s_lo, int s_hi, tsr_batch_layout *p)
{
    p->max_position = 0, p->attended = 0;
    for (int s = s_lo; s < s_hi; s++) {
        const int last = b->host_positions[b->host_seq_row0[s + 1] - 1];
        if (last > p->max_position) p->max_position = last;
    }
    for (int r = b->host_seq_row0[s_lo]; r < b->host_seq_row0[s_hi]; r++) p->attended += b->host_positions[r] + 1.0;
}

int tsr_kv_copy_split(const tsr_batch_layout *b, int window, const tsr_kv_cache *kv, tsr_batch_layout *decode,
                      tsr_batch_layout *rest)
{
    if (!b->host_seq_row0 || !b->host_positions || b->n_seqs < 2) return 0;
    const int32_t *r0 = b->host_seq_row0;
    int cut = 0;
    while (cut < b->n_seqs && r0[cut + 1] - r0[cut] == 1)
        cut++;
    if (cut == 0 || cut == b->n_seqs) return 0;
    /* the decode rows: the first r0[cut] rows, every array as it is */
    tsr_batch_layout dec = *b;
    dec.n_rows = r0[cut], dec.n_seqs = cut;
    part_extent(b, 0, cut, &dec);
    /* the rest: sequence arrays from `cut` on, rows keeping their numbers (seq_row0's values, positions, q and out
     * as they are). row_seq would need its values renumbered and the rope arrays are done with: the copy and the
     * prefill kernels read none of them, so they are cleared rather than left pointing at the wrong sequences. */
    tsr_batch_layout chunks = *b;
    chunks.n_seqs = b->n_seqs - cut, chunks.n_rows = b->n_rows - r0[cut];
    chunks.seq_row0 += cut, chunks.host_seq_row0 += cut;
    chunks.page_tables += (size_t)cut * (size_t)b->max_pages;
    chunks.row_seq = NULL, chunks.inv_freq = NULL, chunks.attn_factor = NULL;
    part_extent(b, cut, b->n_seqs, &chunks);
    if (!tsr_kv_copy_pages(&chunks, window, kv)) return 0;
    *decode = dec, *rest = chunks;
    return cut;
}
