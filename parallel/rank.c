/* Process model (see rank.h): launcher detection, MPI start, local ranks, and leaving cleanly or aborting. */
#include "parallel/rank.h"

#include "parallel/mpi_util.h"

#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static tsr_rank_info info = {.size = 1, .local_size = 1, .worker = -1, .local_worker = -1};
static int initialized, broken;
static char tag[48];

int tsr_rank_launched(void)
{
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

/* The coordinator's answer to the launcher's SIGTERM (another rank died): say so and leave non-zero. Only
 * async-signal-safe calls. */
static void on_term(int sig)
{
    static const char msg[] = "tessera: rank 0 (coordinator): the MPI launcher is ending the job (a worker rank "
                              "exited or was killed); in-flight work failed\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(sig == SIGTERM ? 3 : 4);
}

static void nccl_defaults(void)
{
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    if (!getenv("NCCL_CUMEM_ENABLE") && !getenv("NCCL_P2P_LEVEL")) setenv("NCCL_CUMEM_ENABLE", "0", 0);
}

tsr_status tsr_rank_init(int *argc, char ***argv)
{
    if (initialized) return TSR_OK;
    initialized = 1;
    gethostname(info.host, sizeof info.host - 1);
    if (!tsr_rank_launched()) return TSR_OK;
    nccl_defaults();
    int provided = 0;
    int err = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    if (err != MPI_SUCCESS) return tsr_mpi_fail(err, "MPI_Init_thread");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    info.mpi = 1;
    if (provided < MPI_THREAD_SERIALIZED) {
        broken = 1;
        return tsr_fail(TSR_ERR_UNSUPPORTED,
                        "MPI provides thread level %d; tessera needs MPI_THREAD_SERIALIZED or better", provided);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &info.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &info.size);
    MPI_Comm local;
    err = MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, info.rank, MPI_INFO_NULL, &local);
    if (err != MPI_SUCCESS) {
        broken = 1;
        return tsr_mpi_fail(err, "MPI_Comm_split_type");
    }
    MPI_Comm_rank(local, &info.local_rank);
    MPI_Comm_size(local, &info.local_size);
    /* workers of this host, in world-rank order (the split keeps that order) */
    int *ranks = malloc((size_t)info.local_size * sizeof *ranks);
    if (!ranks) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    MPI_Allgather(&info.rank, 1, MPI_INT, ranks, 1, MPI_INT, local);
    MPI_Comm_free(&local);
    info.n_workers = info.size > 1 ? info.size - 1 : 0;
    info.worker = info.size > 1 && info.rank > 0 ? info.rank - 1 : -1;
    info.local_workers = 0;
    for (int i = 0; i < info.local_size; i++) {
        if (info.size > 1 && ranks[i] == 0) continue;
        if (ranks[i] == info.rank) info.local_worker = info.local_workers;
        info.local_workers++;
    }
    if (info.worker < 0) info.local_worker = -1;
    free(ranks);
    snprintf(tag, sizeof tag, "[rank %d/%d] ", info.rank, info.size);
    if (info.rank == 0 && info.size > 1) {
        signal(SIGTERM, on_term);
        signal(SIGINT, on_term);
    }
    return TSR_OK;
}

const tsr_rank_info *tsr_rank(void)
{
    return &info;
}
int tsr_rank_is_worker(void)
{
    return info.worker >= 0;
}
int tsr_rank_multi(void)
{
    return info.size > 1;
}
void tsr_rank_mark_broken(void)
{
    broken = 1;
}
const char *tsr_rank_tag(void)
{
    return tag;
}

int tsr_rank_finalize(int rc)
{
    if (!info.mpi) return rc;
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin) return rc;
    if (broken) {
        fflush(stdout);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, rc ? rc : 1);
    }
    MPI_Finalize();
    return rc;
}
