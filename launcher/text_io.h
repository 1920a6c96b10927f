/* Text for the commands: a model directory's tokenizer and chat template behind four calls.
 *
 * tsr_text_open() loads DIR/tokenizer.json (+ tokenizer_config.json); the chat template is loaded on first use.
 * Prompts are encoded with the tokenizer's special tokens (BOS as its post-processor says); with `chat`, the
 * prompt becomes one user message rendered through the chat template with the generation prompt, and the result
 * is encoded without adding special tokens again (the template writes them). Streaming output goes through the
 * incremental detokenizer, which never splits a UTF-8 character. */
#ifndef TSR_LAUNCHER_TEXT_IO_H
#define TSR_LAUNCHER_TEXT_IO_H

#include "runtime/status.h"

#include <stdint.h>
#include <stdio.h>

typedef struct tsr_text tsr_text;

tsr_status tsr_text_open(const char *model_dir, tsr_text **out);
void tsr_text_close(tsr_text *t);
tsr_status tsr_text_encode_prompt(tsr_text *t, const char *prompt, int chat, int32_t **ids, int *n);
tsr_status tsr_text_stream_begin(tsr_text *t);
tsr_status tsr_text_stream_push(tsr_text *t, int32_t id, FILE *out);
tsr_status tsr_text_stream_end(tsr_text *t, FILE *out);

#endif
