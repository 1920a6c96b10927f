/* Tokenizer: Hugging Face tokenizer.json (BPE models) read and run in C, matching the `tokenizers` library token for
 * token and byte for byte.
 *
 * Supported: BPE models (vocab, merges in both forms, ignore_merges, byte_fallback, unk_token, fuse_unk,
 * continuing_subword_prefix, end_of_word_suffix), added tokens with all their flags, normalizers (Sequence, Prepend,
 * Replace, NFC/NFD/NFKC/NFKD, Lowercase, Strip), pre-tokenizers (Sequence, Split, ByteLevel, Metaspace,
 * Whitespace, WhitespaceSplit, Digits, Punctuation), post-processors (TemplateProcessing, ByteLevel, Sequence,
 * BertProcessing, RobertaProcessing for single sequences) and decoders (Sequence, Replace, ByteFallback, Fuse, Strip,
 * Metaspace, ByteLevel). Anything else fails to load with TSR_ERR_UNSUPPORTED naming the type.
 *
 * Ownership: tsr_tokenizer_load returns a tokenizer the caller frees with tsr_tokenizer_free. A loaded tokenizer is
 * read-only: encode/decode/lookups may run concurrently from several threads. Buffers returned by encode and decode
 * belong to the caller (free()); text returned by a detokenizer belongs to the detokenizer.
 *
 * Errors: every fallible function returns a tsr_status and records a message (tsr_last_error) naming the file and the
 * field at fault: TSR_ERR_IO (unreadable file), TSR_ERR_FORMAT (malformed JSON, with line and column; malformed
 * fields), TSR_ERR_UNSUPPORTED (unknown component type), TSR_ERR_MISSING (no tokenizer.json in a folder),
 * TSR_ERR_ARG (invalid UTF-8 or NULL arguments), TSR_ERR_NOMEM. */
#ifndef TSR_TEXT_TOKENIZER_H
#define TSR_TEXT_TOKENIZER_H

#include "runtime/status.h"

#include <stddef.h>
#include <stdint.h>

typedef struct tsr_tokenizer tsr_tokenizer;

/* path: a tokenizer.json file, or a folder holding one (then tokenizer_config.json there is read too, when present,
 * for the bos/eos strings). */
tsr_status tsr_tokenizer_load(const char *path, tsr_tokenizer **out);
void tsr_tokenizer_free(tsr_tokenizer *tok);

/* Encodes len bytes of UTF-8 text (NUL bytes allowed). add_special != 0 applies the post-processor (BOS/EOS...).
 * *ids is malloc'ed (never NULL on success, even for zero ids); the caller frees it. */
tsr_status tsr_tokenizer_encode(const tsr_tokenizer *tok, const char *text, size_t len, int add_special,
                                int32_t **ids, size_t *n_ids);

/* Decodes ids to text like tokenizers' Tokenizer.decode: ids that are out of range are skipped, special tokens too
 * when skip_special != 0. *text is malloc'ed and NUL-terminated; the caller frees it. */
tsr_status tsr_tokenizer_decode(const tsr_tokenizer *tok, const int32_t *ids, size_t n, int skip_special,
                                char **text, size_t *len);

int32_t tsr_tokenizer_token_id(const tsr_tokenizer *tok, const char *token); /* -1 if absent */
const char *tsr_tokenizer_token_str(const tsr_tokenizer *tok, int32_t id);    /* NULL if out of range */
size_t tsr_tokenizer_vocab_size(const tsr_tokenizer *tok);                   /* 1 + max id */
int tsr_tokenizer_is_special(const tsr_tokenizer *tok, int32_t id);

/* bos/eos strings from tokenizer_config.json when loaded from a folder (NULL when unknown). */
const char *tsr_tokenizer_bos_token(const tsr_tokenizer *tok);
const char *tsr_tokenizer_eos_token(const tsr_tokenizer *tok);

/* Incremental detokenizer for streaming: push ids one at a time and get the newly completed text. It never returns
 * part of a UTF-8 character, and the concatenation of everything returned by push and flush equals
 * tsr_tokenizer_decode of all the pushed ids. The tokenizer must outlive it. */
typedef struct tsr_detokenizer tsr_detokenizer;
tsr_status tsr_detokenizer_new(const tsr_tokenizer *tok, int skip_special, tsr_detokenizer **out);
/* *text (NUL-terminated, possibly empty) stays valid until the next call on d and is owned by d. */
tsr_status tsr_detokenizer_push(tsr_detokenizer *d, int32_t id, char **text, size_t *len);
/* Emits what was held back (incomplete bytes become U+FFFD, as in the full decode). The detokenizer can then be
 * reused for a new sequence. */
tsr_status tsr_detokenizer_flush(tsr_detokenizer *d, char **text, size_t *len);
void tsr_detokenizer_free(tsr_detokenizer *d);

#endif
