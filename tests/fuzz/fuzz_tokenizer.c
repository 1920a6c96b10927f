/* Fuzz target of the tokenizer: the input is (1) loaded as a tokenizer.json (must fail cleanly or load; a loaded
 * one then encodes and decodes a few strings), and (2) encoded as text and decoded as ids with the seed tokenizers
 * of tests/fuzz/corpus/tokenizer/ (byte-level, SentencePiece-style, Metaspace). Checked: no crash or sanitizer
 * report, invalid UTF-8 is refused with TSR_ERR_ARG, decoded text round-trips through the streaming detokenizer. */
#include "runtime/text/tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static tsr_tokenizer *seeds[3];
static int seeds_loaded;

static void load_seeds(void)
{
    static const char *names[3] = {"bytelevel.json", "sentencepiece.json", "metaspace.json"};
    const char *fx = getenv("TSR_FIXTURES");
    seeds_loaded = 1;
    for (int i = 0; i < 3; i++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/../fuzz/corpus/tokenizer/%s", fx ? fx : "tests/fixtures", names[i]);
        if (tsr_tokenizer_load(p, &seeds[i])) {
            fprintf(stderr, "fuzz_tokenizer: cannot load seed %s: %s\n", p, tsr_last_error());
            abort();
        }
    }
}

static int valid_utf8(const uint8_t *s, size_t n)
{
    /* a plain reference check, independent of the tokenizer's */
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t k;
        uint32_t cp, min;
        if (c < 0x80) { i++; continue; }
        else if ((c & 0xE0) == 0xC0) { k = 2; cp = c & 0x1F; min = 0x80; }
        else if ((c & 0xF0) == 0xE0) { k = 3; cp = c & 0x0F; min = 0x800; }
        else if ((c & 0xF8) == 0xF0) { k = 4; cp = c & 0x07; min = 0x10000; }
        else return 0;
        if (i + k > n) return 0;
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += k;
    }
    return 1;
}

static void exercise(const tsr_tokenizer *tok, const uint8_t *data, size_t size)
{
    int32_t *ids = NULL;
    size_t n = 0;
    for (int special = 0; special < 2; special++) {
        tsr_status st = tsr_tokenizer_encode(tok, (const char *)data, size, special, &ids, &n);
        if (valid_utf8(data, size) != (st == TSR_OK)) {
            if (st != TSR_ERR_ARG || valid_utf8(data, size)) {
                fprintf(stderr, "fuzz_tokenizer: encode status %d for %s UTF-8: %s\n", st,
                        valid_utf8(data, size) ? "valid" : "invalid", tsr_last_error());
                abort();
            }
        }
        free(ids);
        ids = NULL;
    }
    /* the bytes as ids, within and a little beyond the vocabulary */
    size_t vs = tsr_tokenizer_vocab_size(tok);
    size_t m = size / 2;
    int32_t *v = malloc((m ? m : 1) * sizeof *v);
    for (size_t i = 0; i < m; i++) v[i] = (int32_t)((data[2 * i] | (data[2 * i + 1] << 8)) % (vs + 4)) - 2;
    for (int skip = 0; skip < 2; skip++) {
        char *full = NULL;
        size_t fl = 0;
        if (tsr_tokenizer_decode(tok, v, m, skip, &full, &fl)) abort();
        if (!valid_utf8((const uint8_t *)full, fl)) {
            fprintf(stderr, "fuzz_tokenizer: decode produced invalid UTF-8\n");
            abort();
        }
        tsr_detokenizer *d;
        if (tsr_detokenizer_new(tok, skip, &d)) abort();
        char *acc = malloc(fl + 1);
        size_t al = 0;
        for (size_t i = 0; i <= m; i++) {
            char *t;
            size_t l;
            if (i < m ? tsr_detokenizer_push(d, v[i], &t, &l) : tsr_detokenizer_flush(d, &t, &l)) abort();
            if (al + l > fl || !valid_utf8((const uint8_t *)t, l)) {
                fprintf(stderr, "fuzz_tokenizer: stream chunk invalid or longer than the full decode\n");
                abort();
            }
            memcpy(acc + al, t, l);
            al += l;
        }
        if (al != fl || memcmp(acc, full, fl)) {
            fprintf(stderr, "fuzz_tokenizer: streamed text differs from the full decode\n");
            abort();
        }
        free(acc);
        free(full);
        tsr_detokenizer_free(d);
    }
    free(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!seeds_loaded) load_seeds();
    /* (1) as a tokenizer.json */
    char path[64];
    snprintf(path, sizeof path, "/tmp/fuzz-tokenizer-%d.json", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(data, 1, size, f);
        fclose(f);
        tsr_tokenizer *tok;
        if (tsr_tokenizer_load(path, &tok) == TSR_OK) {
            static const char *samples[] = {"hello world", " <s>cat</s> <tool> 1234", "\xf0\x9f\x98\x80 caf\xc3\xa9",
                                            ""};
            for (size_t i = 0; i < sizeof samples / sizeof samples[0]; i++)
                exercise(tok, (const uint8_t *)samples[i], strlen(samples[i]));
            tsr_tokenizer_free(tok);
        } else if (!*tsr_last_error()) {
            fprintf(stderr, "fuzz_tokenizer: load failed without a message\n");
            abort();
        }
        unlink(path);
    }
    /* (2) as text and ids for the seed tokenizers, at most 1 KiB of it: every byte is encoded six times and
     * decoded twelve, which under the sanitizers made the 5 KiB tokenizer.json inputs run at ~15 exec/s */
    for (int i = 0; i < 3; i++) exercise(seeds[i], data, size > 1024 ? 1024 : size);
    return 0;
}
