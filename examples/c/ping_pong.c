/*
 * ping_pong: the transfer API's ping-pong in two processes, in C.
 *
 * Both processes create a transport, bind it, allocate a send and a
 * receive buffer, and publish their URL and the receive buffer's remote
 * key in a file of their own (written whole, then renamed into place).
 * Each reads the other's file (waiting for it up to the timeout),
 * connects, and then they take turns: the side started with --first
 * writes a message into the peer's receive buffer with a notification,
 * the peer waits for it, checks every byte, and answers the same way.
 *
 *   ping_pong --first  --me /tmp/a.url --peer /tmp/b.url -t tcp &
 *   ping_pong --second --me /tmp/b.url --peer /tmp/a.url -t tcp
 *
 * Build: cc -I capi/include ping_pong.c -L target/debug -luct_rs
 *        -Wl,-rpath,target/debug
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "uct_rs.h"

#define PROG "ping_pong"

struct settings {
    const char *me;
    const char *peer;
    const char *transport;
    const char *device;
    int first;
    size_t size;
    unsigned rounds;
    unsigned timeout_s;
    int manual;
    int quiet;
};

static void usage(FILE *out)
{
    fprintf(out,
            "usage: " PROG " (--first | --second) --me FILE --peer FILE [options]\n"
            "\n"
            "A ping-pong of notified writes between two processes over uct-rs; every\n"
            "byte of every message is checked. Each side writes its URL and remote key\n"
            "to --me and reads the other's from --peer (waiting for it).\n"
            "\n"
            "  -f, --first           this side sends the first message (exactly one side)\n"
            "  -S, --second          this side answers\n"
            "  -m, --me FILE         where this side publishes its URL and key\n"
            "  -p, --peer FILE       where the peer publishes its own\n"
            "  -t, --transport NAME  auto (default), tcp, posix, rc, cma, self\n"
            "  -d, --device NAME     the device (lo for tcp on loopback; default: first)\n"
            "  -s, --size BYTES      bytes per message (default 65536)\n"
            "  -n, --rounds N        round trips (default 100)\n"
            "  -w, --timeout SEC     longest wait for the peer or a message (default 30)\n"
            "      --manual          drive progress from the waits (no progress thread)\n"
            "  -q, --quiet           print only errors and the result line\n"
            "  -h, --help            this text\n"
            "\n"
            "Example, two shells:\n"
            "  " PROG " --first  --me /tmp/a --peer /tmp/b -t tcp -d lo\n"
            "  " PROG " --second --me /tmp/b --peer /tmp/a -t tcp -d lo\n"
            "\n"
            "Exit status: 0 every byte verified, 1 a failure (its message on stderr),\n"
            "2 a bad command line. UCT_LOG_LEVEL=info shows what uct-rs decides.\n");
}

/* Reports a failed call with the library's message; returns 0 if s is OK. */
static int failed(uct_rs_status s, const char *what)
{
    if (s == UCT_RS_OK) {
        return 0;
    }
    fprintf(stderr, PROG ": %s failed: %s: %s\n", what, uct_rs_status_name(s),
            uct_rs_last_error());
    return 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The byte at offset i of message `round` sent by side `side`. */
static unsigned char pattern(unsigned round, int side, size_t i)
{
    return (unsigned char)((i * 31u + round * 7u + (unsigned)side * 101u) ^ 0x5au);
}

static int parse_size(const char *text, size_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v == 0 || v > (1ull << 34)) {
        return -1;
    }
    *out = (size_t)v;
    return 0;
}

static int parse_args(int argc, char **argv, struct settings *s)
{
    static const struct option longs[] = {
        {"first", no_argument, NULL, 'f'},   {"second", no_argument, NULL, 'S'},
        {"me", required_argument, NULL, 'm'}, {"peer", required_argument, NULL, 'p'},
        {"transport", required_argument, NULL, 't'},
        {"device", required_argument, NULL, 'd'},
        {"size", required_argument, NULL, 's'}, {"rounds", required_argument, NULL, 'n'},
        {"timeout", required_argument, NULL, 'w'}, {"manual", no_argument, NULL, 'M'},
        {"quiet", no_argument, NULL, 'q'},      {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int role = -1, c;
    size_t n;
    *s = (struct settings){.transport = "auto", .size = 65536, .rounds = 100, .timeout_s = 30};
    while ((c = getopt_long(argc, argv, "fSm:p:t:d:s:n:w:qh", longs, NULL)) != -1) {
        switch (c) {
        case 'f': role = 1; break;
        case 'S': role = 0; break;
        case 'm': s->me = optarg; break;
        case 'p': s->peer = optarg; break;
        case 't': s->transport = optarg; break;
        case 'd': s->device = optarg; break;
        case 's':
            if (parse_size(optarg, &s->size) != 0) {
                fprintf(stderr, PROG ": --size %s: give a number of bytes, 1 to 2^34\n", optarg);
                return -1;
            }
            break;
        case 'n':
        case 'w':
            if (parse_size(optarg, &n) != 0 || n > 100000000u) {
                fprintf(stderr, PROG ": -%c %s: give a number from 1 to 100000000\n", c, optarg);
                return -1;
            }
            if (c == 'n') {
                s->rounds = (unsigned)n;
            } else {
                s->timeout_s = (unsigned)n;
            }
            break;
        case 'M': s->manual = 1; break;
        case 'q': s->quiet = 1; break;
        case 'h': usage(stdout); exit(0);
        default: return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, PROG ": unexpected argument %s\n", argv[optind]);
        return -1;
    }
    if (role < 0 || s->me == NULL || s->peer == NULL) {
        fprintf(stderr, PROG ": give --first or --second, --me FILE and --peer FILE\n");
        return -1;
    }
    s->first = role;
    return 0;
}

/* Publishes the URL and key in `path`, whole: written aside, then renamed. */
static int publish(const char *path, const char *url, const char *key)
{
    size_t len = strlen(path) + 5;
    char *tmp = malloc(len);
    if (tmp == NULL) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    snprintf(tmp, len, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    int bad = f == NULL || fprintf(f, "url %s\nkey %s\n", url, key) < 0;
    if (f != NULL && fclose(f) != 0) {
        bad = 1;
    }
    if (bad || rename(tmp, path) != 0) {
        fprintf(stderr, PROG ": cannot write %s: %s\n", path, strerror(errno));
        unlink(tmp);
        free(tmp);
        return 1;
    }
    free(tmp);
    return 0;
}

/* Reads the peer's URL and key from `path`, waiting up to `timeout_s`. */
static int read_peer(const char *path, unsigned timeout_s, char **url, char **key)
{
    double deadline = now_s() + timeout_s;
    FILE *f;
    while ((f = fopen(path, "r")) == NULL) {
        if (errno != ENOENT) {
            fprintf(stderr, PROG ": cannot read %s: %s\n", path, strerror(errno));
            return 1;
        }
        if (now_s() > deadline) {
            fprintf(stderr,
                    PROG ": %s did not appear within %u s: is the peer running, with "
                         "--me %s?\n",
                    path, timeout_s, path);
            return 1;
        }
        struct timespec pause = {0, 10 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    *url = *key = NULL;
    while ((got = getline(&line, &cap, f)) > 0) {
        if (line[got - 1] == '\n') {
            line[got - 1] = '\0';
        }
        if (strncmp(line, "url ", 4) == 0 && *url == NULL) {
            *url = strdup(line + 4);
        } else if (strncmp(line, "key ", 4) == 0 && *key == NULL) {
            *key = strdup(line + 4);
        }
    }
    free(line);
    fclose(f);
    if (*url == NULL || *key == NULL) {
        fprintf(stderr, PROG ": %s lacks a 'url' or 'key' line: not written by " PROG "?\n", path);
        free(*url);
        free(*key);
        *url = *key = NULL;
        return 1;
    }
    return 0;
}

/* The offset of the first byte of `buf` that is not message `round` of
 * `side`, or `size` if all are. */
static size_t first_wrong(const unsigned char *buf, size_t size, unsigned round, int side)
{
    for (size_t i = 0; i < size; i++) {
        if (buf[i] != pattern(round, side, i)) {
            return i;
        }
    }
    return size;
}

/* Waits for the notification of message `round` and checks it whole. */
static int receive(uct_rs_transport *t, const struct settings *s, const unsigned char *dst,
                   unsigned round)
{
    uct_rs_notification note;
    int64_t timeout_ms = (int64_t)s->timeout_s * 1000;
    if (failed(uct_rs_wait_for_write(t, timeout_ms, &note), "uct_rs_wait_for_write")) {
        return 1;
    }
    if (note.tag != round || note.length != s->size) {
        fprintf(stderr,
                PROG ": round %u: the notification says tag %" PRIu32 " and %zu bytes, "
                     "expected tag %u and %zu bytes\n",
                round, note.tag, note.length, round, s->size);
        return 1;
    }
    size_t bad = first_wrong(dst, s->size, round, !s->first);
    if (bad != s->size) {
        fprintf(stderr, PROG ": round %u: byte %zu is %u, expected %u\n", round, bad, dst[bad],
                pattern(round, !s->first, bad));
        return 1;
    }
    return 0;
}

/* Writes message `round` into the peer's buffer, notified, and waits for it
 * to land. */
static int send_round(uct_rs_transport *t, const struct settings *s, unsigned char *src,
                      uct_rs_view *view, uct_rs_remote *remote, unsigned round)
{
    for (size_t i = 0; i < s->size; i++) {
        src[i] = pattern(round, s->first, i);
    }
    uct_rs_request *req = NULL;
    if (failed(uct_rs_write(t, view, remote, UCT_RS_WRITE_NOTIFY, round, &req), "uct_rs_write")) {
        return 1;
    }
    int bad = failed(uct_rs_request_wait(req, (int64_t)s->timeout_s * 1000), "the write");
    failed(uct_rs_request_free(req), "uct_rs_request_free");
    return bad;
}

int main(int argc, char **argv)
{
    struct settings s;
    if (parse_args(argc, argv, &s) != 0) {
        fprintf(stderr, "try '" PROG " --help'\n");
        return 2;
    }
    int rc = 1;
    uct_rs_transport *t = NULL;
    uct_rs_memory *src = NULL, *dst = NULL;
    uct_rs_view *view = NULL;
    uct_rs_remote *remote = NULL;
    char *url = NULL, *key = NULL, *peer_url = NULL, *peer_key = NULL, *name = NULL;

    uct_rs_transport_options opts;
    if (failed(uct_rs_transport_options_init(&opts), "uct_rs_transport_options_init")) {
        return 1;
    }
    opts.transport = s.transport;
    opts.device = s.device;
    opts.progress = s.manual ? UCT_RS_PROGRESS_MANUAL : UCT_RS_PROGRESS_THREAD;
    /* A stale file of an earlier run must not be read by the peer. */
    unlink(s.me);
    if (failed(uct_rs_transport_create(&opts, &t), "uct_rs_transport_create") ||
        failed(uct_rs_transport_bind(t, &url), "uct_rs_transport_bind") ||
        failed(uct_rs_mem_alloc(t, UCT_RS_MEMORY_HOST, s.size, UCT_RS_REMOTE_ALL, &src),
               "uct_rs_mem_alloc (send buffer)") ||
        failed(uct_rs_mem_alloc(t, UCT_RS_MEMORY_HOST, s.size, UCT_RS_REMOTE_ALL, &dst),
               "uct_rs_mem_alloc (receive buffer)") ||
        failed(uct_rs_mem_view(src, 0, s.size, &view), "uct_rs_mem_view") ||
        failed(uct_rs_mem_remote_key(dst, &key), "uct_rs_mem_remote_key")) {
        goto out;
    }
    uct_rs_region_info src_info, dst_info;
    if (failed(uct_rs_mem_info(src, &src_info), "uct_rs_mem_info") ||
        failed(uct_rs_mem_info(dst, &dst_info), "uct_rs_mem_info")) {
        goto out;
    }
    /* Host memory: its address is this process's. */
    unsigned char *src_bytes = (unsigned char *)(uintptr_t)src_info.address;
    const unsigned char *dst_bytes = (const unsigned char *)(uintptr_t)dst_info.address;
    memset(src_bytes, 0, s.size);

    if (publish(s.me, url, key) != 0 || read_peer(s.peer, s.timeout_s, &peer_url, &peer_key) != 0) {
        goto out;
    }
    if (failed(uct_rs_transport_connect(t, peer_url), "uct_rs_transport_connect") ||
        failed(uct_rs_remote_parse(peer_key, &remote), "uct_rs_remote_parse (the peer's key)") ||
        failed(uct_rs_transport_name(t, &name), "uct_rs_transport_name")) {
        goto out;
    }
    if (!s.quiet) {
        printf(PROG ": %s side connected over %s; %u round trips of %zu bytes\n",
               s.first ? "first" : "second", name, s.rounds, s.size);
        fflush(stdout);
    }
    double start = now_s();
    for (unsigned round = 0; round < s.rounds; round++) {
        if (s.first) {
            if (send_round(t, &s, src_bytes, view, remote, round) != 0 ||
                receive(t, &s, dst_bytes, round) != 0) {
                goto out;
            }
        } else if (receive(t, &s, dst_bytes, round) != 0 ||
                   send_round(t, &s, src_bytes, view, remote, round) != 0) {
            goto out;
        }
    }
    double took = now_s() - start;
    printf(PROG ": %s side: %u round trips of %zu bytes over %s, every byte verified "
                "(%.1f us per round trip)\n",
           s.first ? "first" : "second", s.rounds, s.size, name, took * 1e6 / s.rounds);
    rc = 0;
out:
    /* Everything is freed, whatever failed: a run under valgrind shows no
     * leak. A NULL handle is skipped (freeing it would be an error). The
     * transport goes first: its destroy ends requests still in flight
     * after a failure, so the memory frees below cannot be refused as
     * busy and leave registered bytes behind. */
    if (t != NULL) {
        failed(uct_rs_transport_destroy(t), "uct_rs_transport_destroy");
    }
    if (view != NULL) {
        failed(uct_rs_view_free(view), "uct_rs_view_free");
    }
    if (remote != NULL) {
        failed(uct_rs_remote_free(remote), "uct_rs_remote_free");
    }
    if (src != NULL) {
        failed(uct_rs_mem_free(src), "uct_rs_mem_free");
    }
    if (dst != NULL) {
        failed(uct_rs_mem_free(dst), "uct_rs_mem_free");
    }
    char *strings[] = {url, key, name};
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++) {
        if (strings[i] != NULL) {
            failed(uct_rs_string_free(strings[i]), "uct_rs_string_free");
        }
    }
    free(peer_url);
    free(peer_key);
    return rc;
}
