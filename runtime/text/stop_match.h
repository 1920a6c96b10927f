/* Stop strings over a stream of text pieces: finds the first occurrence of any stop string even when it is split
 * across tokens, and releases only text that can no longer be part of one, so the stop text is never streamed.
 *
 * Feed each newly decoded piece with tsr_stop_push(); it returns the bytes now safe to emit. When a stop string
 * completes, *matched is set, the released text ends right before the match, and later pushes release nothing. At
 * the end of a sequence that did not stop, tsr_stop_flush() releases what was held back. Returned text stays
 * valid until the next call. Held-back text never splits a UTF-8 character.
 *
 * Which stop wins: the occurrence that ends first in the text; if two end at the same byte, the one that starts
 * first (the longer). The result does not depend on how the text was cut into pieces. Released text never splits
 * a UTF-8 character: an incomplete character at the end waits for its last bytes (tsr_stop_flush releases it as
 * it is); if a stop begins inside a character, the released text ends before that character. */
#ifndef TSR_TEXT_STOP_MATCH_H
#define TSR_TEXT_STOP_MATCH_H

#include "runtime/status.h"

#include <stddef.h>

typedef struct tsr_stop_matcher tsr_stop_matcher;

/* Copies the strings; empty strings are rejected (TSR_ERR_ARG). n may be 0 (then push releases everything, except
 * an incomplete UTF-8 character at the end, which waits for its last bytes). */
tsr_status tsr_stop_matcher_new(const char *const *stops, int n, tsr_stop_matcher **out);
void tsr_stop_matcher_free(tsr_stop_matcher *m);

/* *matched (may be NULL) is 1 once a stop has matched, in this push or an earlier one. */
tsr_status tsr_stop_push(tsr_stop_matcher *m, const char *text, size_t len, const char **out, size_t *out_len,
                         int *matched);
/* Releases everything held back (nothing after a match); pushing may go on afterwards. */
tsr_status tsr_stop_flush(tsr_stop_matcher *m, const char **out, size_t *out_len);

/* Index of the stop string that matched, or -1. */
int tsr_stop_which(const tsr_stop_matcher *m);

#endif
