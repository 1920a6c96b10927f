/* Tokenizer benchmark (not a test): load time of a tokenizer and one-thread encode throughput on a text file.
 *
 *   tok_bench TOKENIZER TEXTFILE [REPEAT]
 * Prints the load time, then the best of REPEAT encodes of the whole file in one call and of the file line by line
 * (one call per line), in MB/s. The same measurement as `tessera tokenize --bench`. */
#include "runtime/text/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: tok_bench TOKENIZER TEXTFILE [REPEAT]\n");
        return 2;
    }
    int repeat = argc > 3 ? atoi(argv[3]) : 5;
    double t0 = now_s();
    tsr_tokenizer *tok;
    if (tsr_tokenizer_load(argv[1], &tok)) {
        fprintf(stderr, "%s\n", tsr_last_error());
        return 1;
    }
    double load = now_s() - t0;
    FILE *f = fopen(argv[2], "rb");
    if (!f) return 1;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)len + 1);
    if (fread(text, 1, (size_t)len, f) != (size_t)len) return 1;
    fclose(f);
    double best_whole = 1e30, best_lines = 1e30;
    size_t n_whole = 0, n_lines = 0;
    for (int r = 0; r < repeat; r++) {
        int32_t *ids;
        t0 = now_s();
        if (tsr_tokenizer_encode(tok, text, (size_t)len, 0, &ids, &n_whole)) {
            fprintf(stderr, "%s\n", tsr_last_error());
            return 1;
        }
        double dt = now_s() - t0;
        free(ids);
        if (dt < best_whole) best_whole = dt;
        t0 = now_s();
        n_lines = 0;
        for (long i = 0; i < len;) {
            long j = i;
            while (j < len && text[j] != '\n') j++;
            size_t n;
            if (tsr_tokenizer_encode(tok, text + i, (size_t)(j - i), 0, &ids, &n)) return 1;
            free(ids);
            n_lines += n;
            i = j + 1;
        }
        dt = now_s() - t0;
        if (dt < best_lines) best_lines = dt;
    }
    printf("load %.1f ms | whole text: %ld bytes -> %zu tokens, %.2f MB/s | per line: %zu tokens, %.2f MB/s\n",
           load * 1e3, len, n_whole, (double)len / best_whole / 1e6, n_lines, (double)len / best_lines / 1e6);
    tsr_tokenizer_free(tok);
    free(text);
    return 0;
}
