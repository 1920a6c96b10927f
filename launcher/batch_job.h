/* One OpenAI request running through the service, for the front doors that are not HTTP (tessera batch and the
 * nanomsg intake): its n choices are submitted as service requests, their events are copied into a queue by the
 * service's callbacks, and the front door's own thread applies them to the request's tsr_oai_result (which
 * builds the stream chunks and the final body, launcher/openai.h).
 *
 * Threads: the callbacks run on the service's loop thread and only copy the event (text, token, log-probabilities,
 * usage) into the job queue and signal it; everything else (submitting, applying events, cancelling, freeing)
 * happens on the one thread that owns the queue. That thread can sleep on the queue's condition variable
 * (tsr_job_queue_wait) or poll its file descriptor (tsr_job_queue_fd) together with sockets.
 *
 * Choices are submitted one at a time by tsr_job_pump() so a caller can bound how many are in flight; a full
 * service queue (TSR_ERR_BUSY) leaves the rest for a later pump. Every submitted choice gets exactly one final
 * event (service.h), so a job is finished when it stopped submitting (all submitted, failed or cancelled) and
 * every submitted choice had its final event; only then may it be freed. If the copy of an event cannot be
 * allocated, the choice's final event still arrives (a node reserved at submission), marked as an error.
 *
 * Ownership: the caller owns queues and jobs; a job borrows its queue, service and model, which must outlive it.
 * Errors: tsr_status with tsr_fail messages (NOMEM; the queue's pipe: IO); request problems are tsr_oai_error. */
#ifndef TSR_LAUNCHER_BATCH_JOB_H
#define TSR_LAUNCHER_BATCH_JOB_H

#include "launcher/openai.h"

#include <pthread.h>

typedef struct tsr_job tsr_job;
typedef struct tsr_job_event tsr_job_event;

typedef struct tsr_job_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    tsr_job_event *head, *tail;
    int pipe_rd, pipe_wr; /* -1 until tsr_job_queue_fd() asks for them */
    int signalled;        /* a byte is in the pipe */
} tsr_job_queue;

tsr_status tsr_job_queue_init(tsr_job_queue *q);
/* Frees pending events (their jobs must not be used afterwards). */
void tsr_job_queue_destroy(tsr_job_queue *q);
/* A descriptor that becomes readable when events are queued (created on first call; -1 with a message if the
 * pipe cannot be made). Draining empties it. */
int tsr_job_queue_fd(tsr_job_queue *q);
/* Waits until an event is queued or timeout_s passes. */
void tsr_job_queue_wait(tsr_job_queue *q, double timeout_s);
/* Wakes a waiter without an event (e.g. to make it check a stop flag). */
void tsr_job_queue_kick(tsr_job_queue *q);
/* Takes every queued event (oldest first, linked through tsr_job_event_next). */
tsr_job_event *tsr_job_queue_drain(tsr_job_queue *q);
tsr_job_event *tsr_job_event_next(const tsr_job_event *e);
tsr_job *tsr_job_event_job(const tsr_job_event *e);
void tsr_job_event_free(tsr_job_event *e);

struct tsr_job {
    tsr_oai_request *rq;
    tsr_oai_result *res;
    tsr_service *svc;
    tsr_job_queue *q;
    char id[64]; /* the response id ("cmpl-..."/"chatcmpl-...") */
    int n_choices, n_submitted, n_final;
    uint64_t *ids;        /* service ids of submitted choices */
    unsigned char *final; /* per choice: final event applied */
    struct tsr_job_choice *choices;
    int stopped; /* no more submissions (failed or cancelled) */
    int failed;  /* err holds why the request failed before running */
    tsr_oai_error err;
    uint64_t tokens_out; /* generated tokens applied so far */
    void *user;          /* the caller's */
};

/* Parses body into a job with nothing submitted yet. A request problem returns a job anyway, already finished
 * with failed = 1 and err filled (so the caller reports it like any result); only NOMEM fails. no_stream: the
 * whole response is wanted whatever the body's "stream" says (tessera batch). */
tsr_status tsr_job_new(tsr_service *svc, tsr_job_queue *q, const tsr_oai_model *m, tsr_oai_kind kind,
                       const json_t *body, int no_stream, tsr_job **out);

/* Submits choices until all are, or `budget` were submitted by this call, or the service is busy (*busy = 1).
 * A submission refused for another reason fails the job (err from tsr_oai_error_from_status) and cancels the
 * choices already running. Returns how many it submitted. */
int tsr_job_pump(tsr_job *j, int budget, int *busy);

/* Applies a drained event to its job; with a streaming request *chunk (if chunk is not NULL) receives the chunk
 * for it or NULL. Frees nothing: the caller frees the event. */
tsr_status tsr_job_apply(tsr_job_event *e, json_t **chunk);

/* Cancels every running choice and submits no more; the final events still come. */
void tsr_job_cancel(tsr_job *j);

/* 1 when no more events will come for the job. */
int tsr_job_finished(const tsr_job *j);
/* Choices submitted whose final event was not applied yet. */
int tsr_job_running(const tsr_job *j);

/* For a finished job: the status code and body of the response (200 + tsr_oai_response, or the error and its
 * status: the request's own error, 500 for an execution error). New reference; NULL only when out of memory. */
json_t *tsr_job_response(const tsr_job *j, int *status_code);

void tsr_job_free(tsr_job *j);

#endif
