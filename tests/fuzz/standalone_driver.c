/* A small stand-in for libFuzzer's driver, so fuzz targets run in every build (gcc included) inside CTest.
 *
 * Usage: fuzz_<name> [--seconds S] [--seed N] CORPUS_DIR...
 * Runs every file of the corpus folders through LLVMFuzzerTestOneInput, then, until S seconds have passed,
 * random mutations of them (bit flips, byte changes, truncation, duplication, splicing, interesting bytes).
 * Crashes surface through the sanitizers the target is built with; the process then dies with their report and
 * the driver has written the input to fuzz-last-input.bin in the working directory beforehand. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
    uint8_t *data;
    size_t size;
} input;

static input *seeds;
static size_t n_seeds;

static void add_seed(const uint8_t *data, size_t size)
{
    seeds = realloc(seeds, (n_seeds + 1) * sizeof *seeds);
    seeds[n_seeds].data = malloc(size ? size : 1);
    memcpy(seeds[n_seeds].data, data, size);
    seeds[n_seeds].size = size;
    n_seeds++;
}

static void load_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "fuzz driver: cannot open corpus folder %s\n", dir);
        exit(1);
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fseek(f, 0, SEEK_SET);
        if (len < 0) len = 0;
        uint8_t *buf = malloc((size_t)len + 1);
        size_t got = fread(buf, 1, (size_t)len, f);
        fclose(f);
        add_seed(buf, got);
        free(buf);
    }
    closedir(d);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static const uint8_t interesting[] = {0, 1, 0x7f, 0x80, 0xff, '"', '\\', '{', '}', '[', ']', ',', ':', '%', '-', '9'};

/* Writes a mutated copy of a random seed into buf (capacity cap) and returns its size. */
static size_t mutate(uint8_t *buf, size_t cap)
{
    const input *s = &seeds[rng() % n_seeds];
    size_t n = s->size < cap ? s->size : cap;
    memcpy(buf, s->data, n);
    int rounds = 1 + (int)(rng() % 4);
    for (int r = 0; r < rounds; r++) {
        switch (rng() % 6) {
        case 0: /* flip a bit */
            if (n) buf[rng() % n] ^= (uint8_t)(1u << (rng() % 8));
            break;
        case 1: /* interesting byte */
            if (n) buf[rng() % n] = interesting[rng() % sizeof interesting];
            break;
        case 2: /* truncate */
            if (n) n = rng() % n;
            break;
        case 3: { /* duplicate a span */
            if (!n) break;
            size_t a = rng() % n, len = 1 + rng() % (n - a);
            if (n + len > cap) break;
            memmove(buf + a + len, buf + a, n - a);
            n += len;
            break;
        }
        case 4: { /* splice in a span of another seed */
            const input *o = &seeds[rng() % n_seeds];
            if (!o->size || !n) break;
            size_t a = rng() % o->size, len = 1 + rng() % (o->size - a), at = rng() % n;
            if (at + len > cap) len = cap - at;
            memcpy(buf + at, o->data + a, len);
            if (at + len > n) n = at + len;
            break;
        }
        default: /* random byte */
            if (n) buf[rng() % n] = (uint8_t)rng();
            break;
        }
    }
    return n;
}

int main(int argc, char **argv)
{
    double seconds = 10;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            rng_state = strtoull(argv[++i], NULL, 10) | 1;
        else
            load_dir(argv[i]);
    }
    if (!n_seeds) add_seed((const uint8_t *)"", 0);
    for (size_t i = 0; i < n_seeds; i++) LLVMFuzzerTestOneInput(seeds[i].data, seeds[i].size);

    size_t cap = 1 << 20;
    uint8_t *buf = malloc(cap);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    unsigned long runs = 0;
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec) >= seconds) break;
        for (int k = 0; k < 64; k++) {
            size_t n = mutate(buf, cap);
            FILE *f = fopen("fuzz-last-input.bin", "wb");
            if (f) {
                fwrite(buf, 1, n, f);
                fclose(f);
            }
            LLVMFuzzerTestOneInput(buf, n);
            runs++;
        }
    }
    remove("fuzz-last-input.bin");
    printf("fuzz driver: %zu seeds, %lu mutated runs in %.0f s, no crash\n", n_seeds, runs, seconds);
    free(buf);
    for (size_t i = 0; i < n_seeds; i++) free(seeds[i].data);
    free(seeds);
    return 0;
}
