/* tessera tokenize: encode and decode a list of strings with a tokenizer.json, for checks against Hugging Face
 * tokenizers and for benchmarks.
 *
 *   tessera tokenize --tokenizer PATH --input strings.json --output out.json
 *   tessera tokenize --tokenizer PATH --bench FILE [--repeat N]
 *
 * The output holds, for each input string, {"ids": encode without special tokens, "ids_with_special": encode with
 * the post-processor, "decoded": decode(ids, skip_special_tokens=false)} (what tests/fixtures/reference holds).
 * --bench encodes the whole file N times on one thread and prints MB/s, and the tokenizer's load time. */
#include "launcher/commands.h"
#include "runtime/text/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *out)
{
    fprintf(out,
            "usage: tessera tokenize --tokenizer PATH --input strings.json --output out.json\n"
            "       tessera tokenize --tokenizer PATH --bench TEXTFILE [--repeat N]\n\n"
            "  --tokenizer PATH  a tokenizer.json file, or a folder holding one\n"
            "  --input FILE      JSON array of strings\n"
            "  --output FILE     JSON array of {\"ids\", \"ids_with_special\", \"decoded\"}, one per string, where\n"
            "                    decoded = decode(ids, skip_special_tokens=false)\n"
            "  --bench FILE      encode the file's text (one call) N times and print throughput and load time\n"
            "  --repeat N        repetitions for --bench (default 5)\n");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static json_t *ids_json(const int32_t *ids, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static int bench(const tsr_tokenizer *tok, const char *file, int repeat, double load_s)
{
    FILE *f = fopen(file, "rb");
    if (!f) {
        fprintf(stderr, "tessera tokenize: cannot open %s\n", file);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)len + 1);
    if (!text || fread(text, 1, (size_t)len, f) != (size_t)len) {
        fclose(f);
        free(text);
        fprintf(stderr, "tessera tokenize: cannot read %s\n", file);
        return 1;
    }
    fclose(f);
    double best = 1e30;
    size_t n_ids = 0;
    for (int r = 0; r < repeat; r++) {
        int32_t *ids;
        double t0 = now_s();
        tsr_status st = tsr_tokenizer_encode(tok, text, (size_t)len, 0, &ids, &n_ids);
        double dt = now_s() - t0;
        if (st) {
            fprintf(stderr, "tessera tokenize: %s\n", tsr_last_error());
            free(text);
            return 1;
        }
        free(ids);
        if (dt < best) best = dt;
    }
    printf("load %.1f ms, %ld bytes -> %zu tokens, best of %d: %.1f ms, %.2f MB/s\n", load_s * 1e3, len, n_ids,
           repeat, best * 1e3, (double)len / best / 1e6);
    free(text);
    return 0;
}

int tsr_cmd_tokenize(int argc, char **argv)
{
    const char *tok_path = NULL, *in = NULL, *outp = NULL, *bench_file = NULL;
    int repeat = 5;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tessera tokenize: %s needs a value\n", a);
            usage(stderr);
            return 2;
        }
        if (!strcmp(a, "--tokenizer")) tok_path = argv[++i];
        else if (!strcmp(a, "--input")) in = argv[++i];
        else if (!strcmp(a, "--output")) outp = argv[++i];
        else if (!strcmp(a, "--bench")) bench_file = argv[++i];
        else if (!strcmp(a, "--repeat")) {
            repeat = atoi(argv[++i]);
            if (repeat < 1) {
                fprintf(stderr, "tessera tokenize: --repeat must be a positive integer\n");
                return 2;
            }
        } else {
            fprintf(stderr, "tessera tokenize: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!tok_path || (!bench_file && (!in || !outp))) {
        fprintf(stderr, "tessera tokenize: --tokenizer and either --input/--output or --bench are required\n");
        usage(stderr);
        return 2;
    }
    tsr_tokenizer *tok;
    double t0 = now_s();
    if (tsr_tokenizer_load(tok_path, &tok)) {
        fprintf(stderr, "tessera tokenize: %s\n", tsr_last_error());
        return 1;
    }
    double load_s = now_s() - t0;
    if (bench_file) {
        int rc = bench(tok, bench_file, repeat, load_s);
        tsr_tokenizer_free(tok);
        return rc;
    }
    json_error_t err;
    json_t *inputs = json_load_file(in, JSON_ALLOW_NUL, &err);
    if (!inputs || !json_is_array(inputs)) {
        if (inputs) fprintf(stderr, "tessera tokenize: %s: expected a JSON array of strings\n", in);
        else fprintf(stderr, "tessera tokenize: %s: line %d, column %d: %s\n", in, err.line, err.column, err.text);
        json_decref(inputs);
        tsr_tokenizer_free(tok);
        return 1;
    }
    json_t *results = json_array();
    int rc = 0;
    for (size_t i = 0; i < json_array_size(inputs) && !rc; i++) {
        json_t *s = json_array_get(inputs, i);
        if (!json_is_string(s)) {
            fprintf(stderr, "tessera tokenize: %s: item %zu is not a string\n", in, i);
            rc = 1;
            break;
        }
        int32_t *ids = NULL, *ids_sp = NULL;
        size_t n = 0, n_sp = 0, dlen = 0;
        char *dec = NULL;
        if (tsr_tokenizer_encode(tok, json_string_value(s), json_string_length(s), 0, &ids, &n) ||
            tsr_tokenizer_encode(tok, json_string_value(s), json_string_length(s), 1, &ids_sp, &n_sp) ||
            tsr_tokenizer_decode(tok, ids, n, 0, &dec, &dlen)) {
            fprintf(stderr, "tessera tokenize: string %zu: %s\n", i, tsr_last_error());
            rc = 1;
        } else {
            json_t *o = json_object();
            json_object_set_new(o, "ids", ids_json(ids, n));
            json_object_set_new(o, "ids_with_special", ids_json(ids_sp, n_sp));
            json_object_set_new(o, "decoded", json_stringn(dec, dlen));
            json_array_append_new(results, o);
        }
        free(ids);
        free(ids_sp);
        free(dec);
    }
    if (!rc && json_dump_file(results, outp, JSON_ENSURE_ASCII | JSON_COMPACT)) {
        fprintf(stderr, "tessera tokenize: cannot write %s\n", outp);
        rc = 1;
    }
    json_decref(results);
    json_decref(inputs);
    tsr_tokenizer_free(tok);
    return rc;
}
