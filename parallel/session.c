/* Opening a run in one process, on the coordinator or on a worker (see session.h). */
#include "parallel/session.h"

#include "parallel/comm_mpi.h"
#include "parallel/coordinator.h"
#include "parallel/mpi_util.h"
#include "parallel/protocol.h"
#include "parallel/rank.h"
#include "parallel/shard.h"
#include "parallel/topology.h"
#include "parallel/worker.h"
#include "kernels/cpu/threadpool.h"
#ifdef TSR_HAVE_NCCL
#include "parallel/comm_nccl.h"
#endif
#ifdef TSR_HAVE_CUDA
#include "parallel/cuda_info.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Usable bytes of worker w: its free device memory capped by --gpu-memory (0 when neither is known). */
static tsr_status capacity_of(const tsr_par_opts *o, int w, int n_workers, size_t free_bytes, uint64_t *out)
{
    uint64_t cap = 0;
    if (o->gpu_memory) {
        uint64_t v[TSR_PLAN_MAX];
        int n = 0;
        TSR_TRY(tsr_sizes_parse(o->gpu_memory, v, TSR_PLAN_MAX, &n));
        if (n != 1 && n < n_workers)
            return tsr_fail(TSR_ERR_ARG, "--gpu-memory has %d values for %d workers (give one, or one per worker)", n,
                            n_workers);
        cap = n == 1 ? v[0] : v[w];
    }
    if (free_bytes && (!cap || free_bytes < cap)) cap = free_bytes;
    *out = cap;
    return TSR_OK;
}

static tsr_status make_plan(const tsr_model *m, const tsr_session_req *req, const tsr_par_opts *o, int n_workers,
                            const uint64_t *caps, int gpu, tsr_plan *plan)
{
    tsr_plan_input in;
    memset(&in, 0, sizeof in);
    in.n_workers = n_workers;
    TSR_TRY(tsr_split_parse(o->split, &in.split));
    in.tp = o->tp;
    for (int w = 0; w < n_workers; w++)
        in.capacity[w] = caps[w];
    in.gpu = gpu;
    in.page_size = req->page_size > 0 ? req->page_size : 16;
    in.max_tokens = req->max_tokens > 0 ? req->max_tokens : TSR_STEP_TOKENS_DEFAULT;
    in.kv_dtype = req->kv_dtype == TSR_DTYPE_INVALID ? TSR_F16 : req->kv_dtype;
    in.kv_tokens = req->kv_tokens;
    in.kv_fraction = req->kv_fraction;
    in.max_context = req->max_context;
    return tsr_plan_make(m, &in, plan);
}

/* ---- one process ---- */

static tsr_status open_single(const tsr_session_req *req, const tsr_par_opts *o, tsr_session *s)
{
    tsr_engine_opts eo = {.max_tokens = req->max_tokens,
                          .page_size = req->page_size,
                          .kv_tokens = req->kv_tokens,
                          .kv_fraction = req->kv_fraction,
                          .max_context = req->max_context,
                          .kv_dtype = req->kv_dtype};
    if (req->threads) tsr_threads_set(req->threads);
    TSR_TRY(req->select_backend(req->device, &eo.ops));
    uint64_t cap = 0;
    TSR_TRY(capacity_of(o, 0, 1, eo.ops->memory_free(), &cap));
    if (cap) {
        /* the memory is limited: check the plan before loading, and size the KV pool by it */
        tsr_model *desc = NULL;
        TSR_TRY(tsr_model_load(req->model_dir, &desc));
        tsr_status st = make_plan(desc, req, o, 1, &cap, strcmp(eo.ops->name, "cpu") != 0, &s->plan);
        tsr_model_free(desc);
        TSR_TRY(st);
        eo.kv_tokens = (long)s->plan.n_pages * s->plan.page_size;
        eo.memory_cap = (size_t)cap;
    }
    TSR_TRY(tsr_engine_open(req->model_dir, &eo, &s->engine));
    s->cfg = s->engine->model->cfg;
    return tsr_executor_local(s->engine, &s->x);
}

/* ---- coordinator ---- */

static void say(const tsr_par_opts *o, const char *line)
{
    if (!o->quiet) fprintf(stderr, "tessera: %s%s\n", tsr_rank_tag(), line);
}

static void describe_worker(const tsr_plan *p, int w, char *buf, size_t cap)
{
    const tsr_plan_worker *x = &p->w[w];
    snprintf(buf, cap, "rank %d (worker %d: stage %d, tensor rank %d, layers %d-%d)", w + 1, w, x->stage, x->tp_rank,
             x->layer0, x->layer1 - 1);
}

static tsr_status open_coordinator(const tsr_session_req *req, const tsr_par_opts *o, tsr_session *s)
{
    const tsr_rank_info *ri = tsr_rank();
    const int W = ri->n_workers;
    MPI_Comm ctrl;
    TSR_TRY(tsr_mpi_dup(MPI_COMM_WORLD, &ctrl));
    /* hellos */
    tsr_hello mine, *hellos = calloc((size_t)ri->size, sizeof *hellos);
    memset(&mine, 0, sizeof mine);
    if (!hellos) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    MPI_Request r;
    tsr_status st = TSR_OK;
    int err = MPI_Igather(&mine, sizeof mine, MPI_BYTE, hellos, sizeof mine, MPI_BYTE, 0, ctrl, &r);
    st = err == MPI_SUCCESS ? tsr_mpi_wait(&r, 1, o->load_timeout, "waiting for the workers to start")
                            : tsr_mpi_fail(err, "MPI_Igather");
    if (st != TSR_OK) {
        free(hellos);
        tsr_rank_mark_broken();
        return st;
    }
    /* the coordinator keeps off the cores of this host's workers */
    const char **sets = calloc((size_t)ri->size, sizeof *sets);
    int n_sets = 0;
    for (int i = 1; sets && i < ri->size; i++)
        if (!strcmp(hellos[i].host, ri->host)) sets[n_sets++] = hellos[i].cpuset;
    char desc[512] = "coordinator, unbound (--bind none)";
    if (o->bind) tsr_topo_bind_coordinator(sets, n_sets, desc, sizeof desc);
    free(sets);
    say(o, desc);

    /* the plan, from the model's description and the workers' memory */
    tsr_plan_msg *pm = calloc(1, sizeof *pm);
    if (!pm) {
        free(hellos);
        return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    }
    tsr_model *desc_model = NULL;
    uint64_t caps[TSR_PLAN_MAX] = {0};
    int gpu = 0;
    if (W > TSR_PLAN_MAX) st = tsr_fail(TSR_ERR_ARG, "%d workers (at most %d)", W, TSR_PLAN_MAX);
    for (int w = 0; st == TSR_OK && w < W; w++) {
        caps[w] = hellos[w + 1].capacity;
        gpu |= hellos[w + 1].gpu;
    }
    free(hellos);
    if (st == TSR_OK) st = tsr_model_load(req->model_dir, &desc_model);
    if (st == TSR_OK) st = make_plan(desc_model, req, o, W, caps, gpu, &pm->plan);
    pm->status = st;
    if (st != TSR_OK) snprintf(pm->message, sizeof pm->message, "%s", tsr_last_error());
    err = MPI_Ibcast(pm, sizeof *pm, MPI_BYTE, 0, ctrl, &r);
    tsr_status bst =
        err == MPI_SUCCESS ? tsr_mpi_wait(&r, 1, o->comm_timeout, "sending the plan") : tsr_mpi_fail(err, "MPI_Ibcast");
    if (st == TSR_OK && bst != TSR_OK) st = bst, tsr_rank_mark_broken();
    if (st != TSR_OK) {
        char msg[1100];
        snprintf(msg, sizeof msg, "%s", pm->status != TSR_OK ? pm->message : tsr_last_error());
        free(pm);
        tsr_model_free(desc_model);
        return tsr_fail(st, "%s", msg);
    }
    s->plan = pm->plan;
    free(pm);
    s->cfg = desc_model->cfg;
    tsr_model_free(desc_model);

    /* the workers' communicators (collective over the world; this rank takes no part in them) */
    MPI_Comm none;
    MPI_Comm_split(MPI_COMM_WORLD, MPI_UNDEFINED, 0, &none);
    MPI_Comm_split(MPI_COMM_WORLD, MPI_UNDEFINED, 0, &none);

    /* READY from every worker */
    int failed = 0, answered = 0, first_remote = 0;
    char first[1500] = "";
    while (answered < W) {
        MPI_Status probe;
        st = tsr_mpi_probe(ctrl, MPI_ANY_SOURCE, TSR_TAG_REPLY, o->load_timeout, NULL, &probe,
                           "waiting for the workers to load their parts");
        if (st != TSR_OK) {
            tsr_rank_mark_broken();
            return tsr_fail_context(st, "%d of %d workers answered", answered, W);
        }
        uint8_t *buf = NULL;
        size_t len = 0;
        tsr_msg m;
        if ((st = tsr_msg_recv(ctrl, &probe, &buf, &len, &m)) != TSR_OK) {
            tsr_rank_mark_broken();
            return st;
        }
        answered++;
        if (m.status != TSR_OK || m.type != TSR_MSG_READY) {
            char who[160], line[1500];
            describe_worker(&s->plan, probe.MPI_SOURCE - 1, who, sizeof who);
            snprintf(line, sizeof line, "%s cannot load its part: %.*s", who, (int)m.payload,
                     (const char *)buf + sizeof m);
            fprintf(stderr, "tessera %s: %s\n", req->cmd, line);
            /* the summary names a worker's own failure rather than one that stopped because of another's */
            if (!failed++ || (first_remote && m.status != TSR_ERR_REMOTE)) {
                snprintf(first, sizeof first, "%s", line);
                first_remote = m.status == TSR_ERR_REMOTE;
            }
        }
        free(buf);
    }
    if (failed) {
        tsr_coordinator_shutdown(ctrl, W, o->comm_timeout);
        MPI_Comm_free(&ctrl);
        return tsr_fail(TSR_ERR_REMOTE, "%d worker%s failed to load; the cause: %s", failed, failed > 1 ? "s" : "",
                        first);
    }
    return tsr_coordinator_executor(ctrl, &s->plan, &s->cfg, o->comm_timeout,
                                    tsr_stage_depth(&s->plan, o->micro_batches), &s->x);
}

/* ---- worker ---- */

typedef struct {
    int rank, size;
} shard_arg;

static tsr_status cut_shard(void *ctx, tsr_model *m)
{
    const shard_arg *a = ctx;
    return tsr_shard_model(m, a->rank, a->size);
}

static tsr_status make_comm(MPI_Comm group, int device, double timeout, tsr_comm **out)
{
#ifdef TSR_HAVE_NCCL
    if (device) return tsr_comm_nccl_new(group, timeout, out);
#else
    (void)device;
#endif
    return tsr_comm_mpi_new(group, timeout, out);
}

static int run_worker(const tsr_session_req *req, const tsr_par_opts *o)
{
    const tsr_rank_info *ri = tsr_rank();
    const int w = ri->worker, W = ri->n_workers;
    MPI_Comm ctrl;
    if (tsr_mpi_dup(MPI_COMM_WORLD, &ctrl) != TSR_OK) {
        fprintf(stderr, "tessera: %s%s\n", tsr_rank_tag(), tsr_last_error());
        tsr_rank_mark_broken();
        return 1;
    }
    tsr_status st = TSR_OK;
    char fail_msg[1500] = "";
    /* device and binding */
    char device[64], busid[64] = "";
    const int cuda = !strncmp(req->device ? req->device : "cpu", "cuda", 4);
    if (cuda)
        snprintf(device, sizeof device, "cuda:%d", ri->local_worker);
    else
        snprintf(device, sizeof device, "%s", req->device ? req->device : "cpu");
#ifdef TSR_HAVE_CUDA
    if (cuda) tsr_par_cuda_busid(ri->local_worker, busid, sizeof busid);
#endif
    tsr_hello hello;
    memset(&hello, 0, sizeof hello);
    char desc[512] = "unbound (--bind none)";
    int cores = 0;
    if (o->bind)
        cores = tsr_topo_bind_worker(ri->local_worker, ri->local_workers, cuda ? busid : NULL, desc, sizeof desc,
                                     hello.cpuset, sizeof hello.cpuset);
    int threads = req->threads ? req->threads : cores;
    if (threads > 0) tsr_threads_set(threads);
    const tsr_ops *ops = NULL;
    st = req->select_backend(device, &ops);
    if (st != TSR_OK) snprintf(fail_msg, sizeof fail_msg, "device %s: %s", device, tsr_last_error());
    if (st == TSR_OK) {
        hello.gpu = strcmp(ops->name, "cpu") != 0;
        st = capacity_of(o, w, W, ops->memory_free(), &hello.capacity);
        if (st != TSR_OK) snprintf(fail_msg, sizeof fail_msg, "%s", tsr_last_error());
    }
    hello.cores = cores;
    snprintf(hello.host, sizeof hello.host, "%s", ri->host);
    snprintf(hello.device, sizeof hello.device, "%s", device);
    if (!o->quiet) {
        char line[800];
        snprintf(line, sizeof line, "worker %d (local %d of %d on %s), %s%s%s: %s", w, ri->local_worker,
                 ri->local_workers, ri->host, device, busid[0] ? " " : "", busid, desc);
        say(o, line);
    }
    MPI_Request r;
    int err = MPI_Igather(&hello, sizeof hello, MPI_BYTE, NULL, sizeof hello, MPI_BYTE, 0, ctrl, &r);
    tsr_status cst = err == MPI_SUCCESS ? tsr_mpi_wait(&r, 1, o->load_timeout, "saying hello to rank 0")
                                        : tsr_mpi_fail(err, "MPI_Igather");
    tsr_plan_msg *pm = calloc(1, sizeof *pm);
    if (cst == TSR_OK && !pm) cst = tsr_fail(TSR_ERR_NOMEM, "out of memory");
    if (cst == TSR_OK) {
        err = MPI_Ibcast(pm, sizeof *pm, MPI_BYTE, 0, ctrl, &r);
        cst = err == MPI_SUCCESS ? tsr_mpi_wait(&r, 1, o->load_timeout, "waiting for the plan")
                                 : tsr_mpi_fail(err, "MPI_Ibcast");
    }
    if (cst != TSR_OK) {
        fprintf(stderr, "tessera: %s%s\n", tsr_rank_tag(), tsr_last_error());
        free(pm);
        tsr_rank_mark_broken();
        return 1;
    }
    if (pm->status != TSR_OK) { /* rank 0 says why */
        free(pm);
        MPI_Comm_free(&ctrl);
        return 1;
    }
    tsr_plan plan = pm->plan;
    free(pm);
    const tsr_plan_worker *me = &plan.w[w];
    /* communicators: all workers (stage to stage), and this worker's tensor group */
    MPI_Comm workers, group;
    MPI_Comm_split(MPI_COMM_WORLD, 0, ri->rank, &workers);
    MPI_Comm_split(MPI_COMM_WORLD, me->stage, ri->rank, &group);
    tsr_comm *pipe = NULL, *tp = NULL, *tp_host = NULL;
    tsr_engine *engine = NULL;
    if (st == TSR_OK) st = tsr_plan_check(&plan, plan.n_layers);
    if (st != TSR_OK && !fail_msg[0]) snprintf(fail_msg, sizeof fail_msg, "%s", tsr_last_error());
    /* every worker must be able to go on before any communicator is made: one that skipped a collective (its
     * device failed) would leave the others of its group waiting in it */
    int all_ok = st == TSR_OK, mine = all_ok;
    err = MPI_Iallreduce(&mine, &all_ok, 1, MPI_INT, MPI_MIN, workers, &r);
    tsr_status ast = err == MPI_SUCCESS ? tsr_mpi_wait(&r, 1, o->load_timeout, "agreeing to load")
                                        : tsr_mpi_fail(err, "MPI_Iallreduce");
    if (st == TSR_OK && (ast != TSR_OK || !all_ok)) {
        st = ast != TSR_OK ? ast : tsr_fail(TSR_ERR_REMOTE, "another worker could not start");
        snprintf(fail_msg, sizeof fail_msg, "stopped: %s", tsr_last_error());
    }
    const int device_comm = st == TSR_OK && hello.gpu;
    if (st == TSR_OK && plan.n_stages > 1) st = make_comm(workers, device_comm, o->comm_timeout, &pipe);
    if (st == TSR_OK && plan.tp > 1) st = tsr_comm_mpi_new(group, o->comm_timeout, &tp_host);
    if (st == TSR_OK && plan.tp > 1) {
        if (device_comm)
            st = make_comm(group, 1, o->comm_timeout, &tp);
        else
            tp = tp_host;
    }
    if (st != TSR_OK && !fail_msg[0]) snprintf(fail_msg, sizeof fail_msg, "communicators: %s", tsr_last_error());
    MPI_Comm_free(&workers);
    MPI_Comm_free(&group);
    /* the part */
    shard_arg sa = {me->tp_rank, plan.tp};
    tsr_model_part part = tsr_plan_part(&plan, w);
    if (st == TSR_OK) {
        tsr_engine_opts eo = {.max_tokens = plan.max_tokens,
                              .page_size = plan.page_size,
                              .kv_tokens = (long)plan.n_pages * plan.page_size,
                              .max_context = plan.max_context,
                              .kv_dtype = (tsr_dtype)plan.kv_dtype,
                              .ops = ops,
                              .part = &part,
                              .on_load = plan.tp > 1 ? cut_shard : NULL,
                              .on_load_ctx = &sa};
        st = tsr_engine_open(req->model_dir, &eo, &engine);
        if (st == TSR_OK && engine->kv.n_pages != plan.n_pages)
            st = tsr_fail(TSR_ERR_INTERNAL, "KV pool of %d pages, the plan says %d", engine->kv.n_pages, plan.n_pages);
        if (st != TSR_OK) snprintf(fail_msg, sizeof fail_msg, "%s: %s", tsr_status_str(st), tsr_last_error());
    }
    tsr_worker wk = {ctrl, ri->rank, {0}, o->comm_timeout};
    wk.stage.engine = engine;
    wk.stage.plan = &plan;
    wk.stage.worker = w;
    wk.stage.tp = tp;
    wk.stage.tp_host = tp_host;
    wk.stage.pipe = pipe;
    wk.stage.micro_batches = o->micro_batches;
    /* connect the tensor group only when every member loaded (else some would wait for the missing one) */
    int group_ok = 1;
    if (tp_host) {
        float failed = st != TSR_OK;
        group_ok = tp_host->allreduce_sum(tp_host, &failed, 1) == TSR_OK && failed == 0;
    }
    if (st == TSR_OK && group_ok && (st = tsr_stage_attach(&wk.stage)) != TSR_OK)
        snprintf(fail_msg, sizeof fail_msg, "connecting the tensor group: %s", tsr_last_error());
    tsr_msg ready = tsr_msg_make(TSR_MSG_READY, ri->rank);
    ready.status = st;
    cst = tsr_msg_send(ctrl, 0, TSR_TAG_REPLY, &ready, fail_msg, st == TSR_OK ? 0 : strlen(fail_msg), o->comm_timeout);
    int rc = 1;
    if (cst != TSR_OK) {
        fprintf(stderr, "tessera: %s%s\n", tsr_rank_tag(), tsr_last_error());
        tsr_rank_mark_broken();
    } else if (st != TSR_OK) {
        /* rank 0 reports it; wait for the shutdown */
        for (;;) {
            MPI_Status probe;
            if (tsr_mpi_probe(ctrl, 0, TSR_TAG_CTRL, o->comm_timeout > 0 ? o->comm_timeout : 60, NULL, &probe,
                              "waiting for shutdown") != TSR_OK) {
                tsr_rank_mark_broken();
                break;
            }
            uint8_t *buf = NULL;
            size_t len = 0;
            tsr_msg m;
            if (tsr_msg_recv(ctrl, &probe, &buf, &len, &m) != TSR_OK) {
                tsr_rank_mark_broken();
                break;
            }
            free(buf);
            if (m.type == TSR_MSG_SHUTDOWN) break;
        }
    } else {
        rc = tsr_worker_loop(&wk);
    }
    tsr_stage_free(&wk.stage);
    tsr_engine_close(engine);
    if (tp && tp != tp_host) tsr_comm_free(tp);
    tsr_comm_free(tp_host);
    tsr_comm_free(pipe);
    if (rc == 0) MPI_Comm_free(&ctrl);
    return rc;
}

void tsr_session_cancel(const char *why)
{
    const tsr_rank_info *ri = tsr_rank();
    if (!tsr_rank_multi() || tsr_rank_is_worker()) return;
    tsr_hello mine, *hellos = calloc((size_t)ri->size, sizeof *hellos);
    tsr_plan_msg *pm = calloc(1, sizeof *pm);
    memset(&mine, 0, sizeof mine);
    MPI_Request r;
    MPI_Comm ctrl; /* the same duplicate of the world the workers make */
    tsr_status st = tsr_mpi_dup(MPI_COMM_WORLD, &ctrl);
    if (st == TSR_OK && (!hellos || !pm)) st = TSR_ERR_NOMEM;
    if (st == TSR_OK)
        st = MPI_Igather(&mine, sizeof mine, MPI_BYTE, hellos, sizeof mine, MPI_BYTE, 0, ctrl, &r) == MPI_SUCCESS
                 ? tsr_mpi_wait(&r, 1, 60, "telling the workers to leave")
                 : TSR_ERR_REMOTE;
    if (st == TSR_OK) {
        pm->status = TSR_ERR_ARG;
        snprintf(pm->message, sizeof pm->message, "cancelled on rank 0: %s", why ? why : "");
        st = MPI_Ibcast(pm, sizeof *pm, MPI_BYTE, 0, ctrl, &r) == MPI_SUCCESS
                 ? tsr_mpi_wait(&r, 1, 60, "telling the workers to leave")
                 : TSR_ERR_REMOTE;
    }
    if (st != TSR_OK) tsr_rank_mark_broken();
    free(hellos);
    free(pm);
}

/* ---- entry ---- */

tsr_status tsr_session_open(const tsr_session_req *req, const tsr_par_opts *o, tsr_session **out)
{
    tsr_session *s = calloc(1, sizeof *s);
    if (!s) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    tsr_par_opts dflt;
    if (!o) {
        tsr_par_opts_init(&dflt);
        o = &dflt;
    }
    tsr_status st;
    if (!tsr_rank_multi()) {
        st = open_single(req, o, s);
    } else if (tsr_rank_is_worker()) {
        s->worker = 1;
        s->worker_rc = run_worker(req, o);
        st = TSR_OK;
    } else {
        st = open_coordinator(req, o, s);
    }
    if (st != TSR_OK) {
        tsr_session_close(s);
        return st;
    }
    *out = s;
    return TSR_OK;
}

void tsr_session_close(tsr_session *s)
{
    if (!s) return;
    if (s->x) s->x->close(s->x);
    tsr_engine_close(s->engine);
    free(s);
}
