/* Experiment only, never shipped: an LD_PRELOAD shim that stamps the TSC
 * around each ibv_post_send, ibv_post_recv and ibv_poll_cq of any verbs
 * program (ours, ucx_perftest, ib_write_lat, ...), the same way for all,
 * for scripts/exp-verbs-calls (docs/perf-rc-notes.md).
 *
 * Those three are inline functions of verbs.h that call through the
 * context's ops table, so no symbol can be interposed: the shim interposes
 * ibv_open_device (exported, called through the PLT by all three programs)
 * and swaps the table's three entries for timed wrappers. The real
 * ibv_open_device is looked up in the already loaded libibverbs (RTLD_NEXT
 * misses it where the caller is a library opened with RTLD_LOCAL).
 *
 * Each process writes VERBS_CALLS_DIR/calls-PID.txt at exit: a header
 * line "prog NAME misses N dropped D tsc_per_ns R marker ADDR", then one line per post and per
 * poll that returned completions: "S t_in t_out opcode flags last_poll_out"
 * (the exit of this thread's last poll before it), "R t_in t_out len chained 0"
 * (the first receive's buffer length, how many receives the call posted),
 * "P t_in t_out n opcode prev_in" (prev_in: the entry of the poll before,
 * on this thread); 0 where there is none. Lines starting "# " after the
 * header say what the program created (CQs, QPs: ibv_create_cq and
 * ibv_create_qp are interposed too, to log their arguments).
 *
 * Limits: ibv_post_srq_recv (ucx_perftest reposts through an SRQ) and the
 * _ex verbs (ibv_create_cq_ex: ucx_perftest's CQs) are not wrapped, so such
 * calls are neither stamped nor logged; the records are written at exit
 * without a lock (the programs post from one thread); one provider only.
 *
 * VERBS_CALLS_NAP_US=N with VERBS_CALLS_NAP_ARG=S: a process with S among
 * its arguments (such as --listen, ours' server) sleeps N us after each
 * poll that found nothing, so that a server which spins in progress
 * through a one-sided test mostly sleeps instead (what its spinning costs
 * the other vCPU under the emulator).
 *
 * Build: cc -O2 -shared -fPIC -o exp-verbs-calls.so exp-verbs-calls.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <dirent.h>
#include <sys/resource.h>
#include <errno.h>
#include <stdarg.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#define MAX_REC (1 << 19)

struct rec {
    char kind;
    uint64_t t_in, t_out, prev_in;
    int n, op, flags;
};

static struct rec recs[MAX_REC];
static unsigned long nrec, misses;
/* The TSC against CLOCK_MONOTONIC at the first open and at exit: its rate. */
static uint64_t tsc0, ns0;

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
static __thread uint64_t last_poll_in, last_poll_out;

/* What each program set up, for the header: CQs, QPs, MRs. */
static char setup[8192];
static size_t setup_len;

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (setup_len < sizeof(setup)) {
        int k = vsnprintf(setup + setup_len, sizeof(setup) - setup_len, fmt, ap);
        /* vsnprintf returns the untruncated length: keep to what fits. */
        if (k > 0)
            setup_len += (size_t)k;
        if (setup_len > sizeof(setup) - 1)
            setup_len = sizeof(setup) - 1;
    }
    va_end(ap);
}

static void *real_sym(const char *name)
{
    void *lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
    return lib ? dlsym(lib, name) : NULL;
}

struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
                             struct ibv_comp_channel *channel, int comp_vector)
{
    struct ibv_cq *(*real)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int) =
        (struct ibv_cq * (*)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int))
            real_sym("ibv_create_cq");
    if (!real)
        return NULL;
    struct ibv_cq *cq = real(ctx, cqe, cq_context, channel, comp_vector);
    note("# cq %p cqe %d (asked %d) channel %d\n", (void *)cq, cq ? cq->cqe : 0, cqe, channel != NULL);
    return cq;
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
    struct ibv_qp *(*real)(struct ibv_pd *, struct ibv_qp_init_attr *) =
        (struct ibv_qp * (*)(struct ibv_pd *, struct ibv_qp_init_attr *)) real_sym("ibv_create_qp");
    if (!real)
        return NULL;
    struct ibv_qp *qp = real(pd, a);
    note("# qp type %d send_cq %p recv_cq %p srq %d send_wr %u recv_wr %u send_sge %u recv_sge %u "
         "inline %u sig_all %d\n",
         a->qp_type, (void *)a->send_cq, (void *)a->recv_cq, a->srq != NULL, a->cap.max_send_wr,
         a->cap.max_recv_wr, a->cap.max_send_sge, a->cap.max_recv_sge, a->cap.max_inline_data,
         a->sq_sig_all);
    return qp;
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
    int (*real)(struct ibv_qp *, struct ibv_qp_attr *, int) =
        (int (*)(struct ibv_qp *, struct ibv_qp_attr *, int))real_sym("ibv_modify_qp");
    if (!real)
        return ENOSYS;
    if (mask & IBV_QP_AV)
        note("# rtr qp %u global %d sgid_index %u mtu %d timeout %u retry %u rnr_retry %u "
             "min_rnr %u max_rd %u max_dest_rd %u\n",
             qp->qp_num, attr->ah_attr.is_global, attr->ah_attr.grh.sgid_index,
             (mask & IBV_QP_PATH_MTU) ? (int)attr->path_mtu : -1,
             (mask & IBV_QP_TIMEOUT) ? attr->timeout : 255,
             (mask & IBV_QP_RETRY_CNT) ? attr->retry_cnt : 255,
             (mask & IBV_QP_RNR_RETRY) ? attr->rnr_retry : 255,
             (mask & IBV_QP_MIN_RNR_TIMER) ? attr->min_rnr_timer : 255,
             (mask & IBV_QP_MAX_QP_RD_ATOMIC) ? attr->max_rd_atomic : 255,
             (mask & IBV_QP_MAX_DEST_RD_ATOMIC) ? attr->max_dest_rd_atomic : 255);
    if (mask & IBV_QP_TIMEOUT && !(mask & IBV_QP_AV))
        note("# rts qp %u timeout %u retry %u rnr_retry %u max_rd %u\n", qp->qp_num, attr->timeout,
             attr->retry_cnt, attr->rnr_retry,
             (mask & IBV_QP_MAX_QP_RD_ATOMIC) ? attr->max_rd_atomic : 255);
    return real(qp, attr, mask);
}

static int (*real_post_send)(struct ibv_qp *, struct ibv_send_wr *, struct ibv_send_wr **);
static int (*real_post_recv)(struct ibv_qp *, struct ibv_recv_wr *, struct ibv_recv_wr **);
static int (*real_poll_cq)(struct ibv_cq *, int, struct ibv_wc *);

static struct rec *take(char kind)
{
    unsigned long i = __atomic_fetch_add(&nrec, 1, __ATOMIC_RELAXED);
    if (i >= MAX_REC)
        return NULL;
    recs[i].kind = kind;
    return &recs[i];
}

/* Records one call: its kind, entry and exit stamps and three figures. */
static void put(char kind, uint64_t t_in, uint64_t t_out, int n, int op, int flags, uint64_t prev_in)
{
    struct rec *e = take(kind);
    if (e) {
        e->t_in = t_in;
        e->t_out = t_out;
        e->n = n;
        e->op = op;
        e->flags = flags;
        e->prev_in = prev_in;
    }
}

/* The posting thread's usage at its first post: what the run itself
 * costs is the usage at exit less this. */
static struct rusage first_usage;
static int have_first_usage;
static pid_t first_usage_tid;

/* VERBS_CALLS_TOUCH=N: before each post, read a byte of each of N pages
 * of the shim's own, so that a program touches more memory on its path
 * (an A/B of the footprint, for the plain programs). */
static volatile char *touch_pages;
static long touch_n;

static void touch(void)
{
    for (long i = 0; i < touch_n; i++)
        (void)touch_pages[i * 4096];
}

/* A load of this, once per post, marks the posts in a memory trace
 * (valgrind --tool=lackey, scripts/exp-verbs-pages); its address is in the
 * header as "marker". */
static volatile uint64_t marker;

static int timed_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    (void)marker;
    if (touch_n)
        touch();
    if (!__atomic_load_n(&have_first_usage, __ATOMIC_ACQUIRE)) {
        getrusage(RUSAGE_THREAD, &first_usage);
        first_usage_tid = gettid();
        __atomic_store_n(&have_first_usage, 1, __ATOMIC_RELEASE);
    }
    uint64_t t0 = __rdtsc();
    int r = real_post_send(qp, wr, bad);
    uint64_t t1 = __rdtsc();
    put('S', t0, t1, 0, wr ? (int)wr->opcode : -1, wr ? (int)wr->send_flags : 0, last_poll_out);
    return r;
}

static int timed_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    uint64_t t0 = __rdtsc();
    int r = real_post_recv(qp, wr, bad);
    uint64_t t1 = __rdtsc();
    /* The first receive's buffer length, and how many were chained. */
    int chained = 0;
    for (struct ibv_recv_wr *w = wr; w; w = w->next)
        chained++;
    put('R', t0, t1, 0, wr && wr->num_sge > 0 ? (int)wr->sg_list[0].length : 0, chained, 0);
    return r;
}

/* VERBS_CALLS_NAP_US, where this process's arguments hold
 * VERBS_CALLS_NAP_ARG; 0 otherwise. */
static long nap_us;

static long nap_setting(void)
{
    const char *us = getenv("VERBS_CALLS_NAP_US"), *arg = getenv("VERBS_CALLS_NAP_ARG");
    if (!us || !arg || atol(us) <= 0)
        return 0;
    char buf[8192];
    FILE *f = fopen("/proc/self/cmdline", "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    for (size_t i = 0; i < n; i += strlen(buf + i) + 1)
        if (strcmp(buf + i, arg) == 0)
            return atol(us) < 10000000 ? atol(us) : 10000000;
    return 0;
}

static int timed_poll_cq(struct ibv_cq *cq, int num, struct ibv_wc *wc)
{
    uint64_t t0 = __rdtsc();
    int r = real_poll_cq(cq, num, wc);
    uint64_t t1 = __rdtsc();
    uint64_t prev = last_poll_in;
    last_poll_in = t0;
    last_poll_out = t1;
    if (r <= 0) {
        __atomic_fetch_add(&misses, 1, __ATOMIC_RELAXED);
        if (nap_us > 0 && r == 0) {
            /* After this poll's stamps: the napping process's own
             * records count the nap as time between calls (only the
             * server naps, and its records are not read). */
            struct timespec ts = {nap_us / 1000000, (nap_us % 1000000) * 1000};
            nanosleep(&ts, NULL);
        }
        return r;
    }
    /* A receive when any completion of the batch is one (a CQ shared
     * by sends and receives may return a send first). */
    int op = (int)wc[0].opcode;
    for (int i = 0; i < r; i++)
        if (wc[i].opcode & IBV_WC_RECV)
            op = (int)wc[i].opcode;
    put('P', t0, t1, r, op, 0, prev);
    return r;
}

struct ibv_context *ibv_open_device(struct ibv_device *device)
{
    static struct ibv_context *(*real_open)(struct ibv_device *);
    if (!real_open) {
        real_open = (struct ibv_context * (*)(struct ibv_device *)) real_sym("ibv_open_device");
        if (!real_open) {
            fprintf(stderr, "exp-verbs-calls: no ibv_open_device in the loaded libibverbs\n");
            errno = ENOSYS;
            return NULL;
        }
    }
    struct ibv_context *ctx = real_open(device);
    if (!ctx)
        return NULL;
    /* One provider in these runs: the first context's entries serve all. */
    if (!real_post_send) {
        const char *t = getenv("VERBS_CALLS_TOUCH");
        if (t && atol(t) > 0) {
            touch_pages = calloc((size_t)atol(t), 4096);
            if (touch_pages) {
                touch_n = atol(t);
                for (long i = 0; i < touch_n; i++)
                    touch_pages[i * 4096] = 1;
            }
        }
        /* Fault in the first records now, not inside a timed path. */
        memset(recs, 0, sizeof(recs[0]) * (MAX_REC / 16));
        ns0 = mono_ns();
        tsc0 = __rdtsc();
        real_post_send = ctx->ops.post_send;
        real_post_recv = ctx->ops.post_recv;
        real_poll_cq = ctx->ops.poll_cq;
        nap_us = nap_setting();
    }
    if (ctx->ops.post_send == real_post_send)
        ctx->ops.post_send = timed_post_send;
    if (ctx->ops.post_recv == real_post_recv)
        ctx->ops.post_recv = timed_post_recv;
    if (ctx->ops.poll_cq == real_poll_cq)
        ctx->ops.poll_cq = timed_poll_cq;
    return ctx;
}

__attribute__((destructor)) static void dump(void)
{
    const char *dir = getenv("VERBS_CALLS_DIR");
    if (!dir || !real_post_send)
        return;
    uint64_t tsc1 = __rdtsc(), ns1 = mono_ns();
    double per_ns = ns1 > ns0 ? (double)(tsc1 - tsc0) / (double)(ns1 - ns0) : 0.0;
    char path[4096], prog[256] = "?";
    ssize_t k = readlink("/proc/self/exe", path, sizeof(path) - 1);
    if (k > 0) {
        path[k] = 0;
        const char *b = strrchr(path, '/');
        snprintf(prog, sizeof(prog), "%s", b ? b + 1 : path);
    }
    snprintf(path, sizeof(path), "%s/calls-%d.txt", dir, (int)getpid());
    FILE *f = fopen(path, "w");
    if (!f)
        return;
    unsigned long n = nrec < MAX_REC ? nrec : MAX_REC;
    fprintf(f, "prog %s misses %lu dropped %lu tsc_per_ns %.6f marker %p\n", prog, misses, nrec - n,
            per_ns, (void *)&marker);
    fwrite(setup, 1, setup_len, f);
    struct rusage u;
    if (have_first_usage && first_usage_tid != gettid())
        fprintf(f, "# run usage not known: the thread that posted first is not the one exiting\n");
    else if (have_first_usage && getrusage(RUSAGE_THREAD, &u) == 0) {
        double ut = (u.ru_utime.tv_sec - first_usage.ru_utime.tv_sec) +
                    (u.ru_utime.tv_usec - first_usage.ru_utime.tv_usec) / 1e6;
        double st = (u.ru_stime.tv_sec - first_usage.ru_stime.tv_sec) +
                    (u.ru_stime.tv_usec - first_usage.ru_stime.tv_usec) / 1e6;
        fprintf(f, "# run user %.3f s system %.3f s voluntary %ld nonvoluntary %ld\n", ut, st,
                u.ru_nvcsw - first_usage.ru_nvcsw, u.ru_nivcsw - first_usage.ru_nivcsw);
    }
    /* Each thread's name and context switches: a thread that wakes, or a
     * process preempted more often, would show here. */
    DIR *d = opendir("/proc/self/task");
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char tp[300], line[256], name[64] = "?";
        long vol = -1, invol = -1;
        snprintf(tp, sizeof(tp), "/proc/self/task/%s/status", de->d_name);
        FILE *t = fopen(tp, "r");
        while (t && fgets(line, sizeof(line), t)) {
            sscanf(line, "Name: %63s", name);
            sscanf(line, "voluntary_ctxt_switches: %ld", &vol);
            sscanf(line, "nonvoluntary_ctxt_switches: %ld", &invol);
        }
        if (t)
            fclose(t);
        fprintf(f, "# thread %s %s voluntary %ld nonvoluntary %ld\n", de->d_name, name, vol, invol);
    }
    if (d)
        closedir(d);
    for (unsigned long i = 0; i < n; i++) {
        struct rec *e = &recs[i];
        fprintf(f, "%c %lu %lu %d %d %lu\n", e->kind, (unsigned long)e->t_in,
                (unsigned long)e->t_out, e->kind == 'P' ? e->n : e->op,
                e->kind == 'P' ? e->op : e->flags, (unsigned long)e->prev_in);
    }
    fclose(f);
}
