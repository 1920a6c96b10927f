/* A progress bar on stderr for long runs (tessera batch): requests done of total, generated tokens per second
 * and the time left.
 *
 * On a terminal it redraws one line in place (carriage return, at most 10 times a second, as wide as the terminal
 * from TIOCGWINSZ, 80 columns otherwise). When stderr is not a terminal and the bar was asked for (--progress),
 * it prints one plain line at every 10% instead. Rates and the ETA count only work done in this run (a resumed
 * run starts with the earlier results already "done"). Not thread-safe: one thread updates it.
 * Nothing here fails. */
#ifndef TSR_LAUNCHER_BATCH_PROGRESS_H
#define TSR_LAUNCHER_BATCH_PROGRESS_H

#include <stdint.h>

typedef enum tsr_progress_mode {
    TSR_PROGRESS_AUTO = 0, /* a bar when stderr is a terminal, nothing otherwise */
    TSR_PROGRESS_ON,       /* a bar on a terminal, 10% lines otherwise */
    TSR_PROGRESS_OFF,
} tsr_progress_mode;

typedef struct tsr_progress {
    int enabled, tty;
    double t0, last_draw;
    long done0; /* done when the run started (resumed results) */
    int last_decile;
    int drawn; /* a bar line is on screen */
} tsr_progress;

/* done0: results already present at the start. */
void tsr_progress_init(tsr_progress *p, tsr_progress_mode mode, long done0);

/* total < 0: unknown. force: draw now whatever the rate limit. */
void tsr_progress_update(tsr_progress *p, long done, long total, uint64_t tokens, int force);

/* Draws the final state and ends the line. */
void tsr_progress_finish(tsr_progress *p, long done, long total, uint64_t tokens);

#endif
