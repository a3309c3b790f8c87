/*
 * transport_info: what uct-rs finds on this machine, printed by a C
 * program through the listing of the C API: the build, the transports
 * probed, components, modules with their status, memory domains and
 * transports with their capabilities (what `transport-info -a` prints).
 *
 *   transport_info            everything
 *   transport_info --probe    one line per transport: usable or why not
 *
 * Build: cc -I capi/include transport_info.c -L target/debug -luct_rs
 *        -Wl,-rpath,target/debug
 */
#include <stdio.h>
#include <string.h>

#include "uct_rs.h"

#define PROG "transport_info"

static int failed(uct_rs_status s, const char *what)
{
    if (s == UCT_RS_OK) {
        return 0;
    }
    fprintf(stderr, PROG ": %s failed: %s: %s\n", what, uct_rs_status_name(s),
            uct_rs_last_error());
    return 1;
}

/* A string of the listing, or "-" for NULL. */
static const char *or_dash(const char *s)
{
    return s != NULL && s[0] != '\0' ? s : "-";
}

static size_t count(uct_rs_listing *l, uct_rs_list_kind what)
{
    size_t n = 0;
    return failed(uct_rs_listing_count(l, what, &n), "uct_rs_listing_count") ? 0 : n;
}

static int print_probe(uct_rs_listing *l)
{
    for (size_t i = 0; i < count(l, UCT_RS_LIST_PROBE); i++) {
        uct_rs_probe_entry e;
        if (failed(uct_rs_listing_probe(l, i, &e), "uct_rs_listing_probe")) {
            return 1;
        }
        if (e.usable) {
            printf("probe %s %s usable\n", e.transport, or_dash(e.device));
        } else {
            printf("probe %s - absent: %s\n", e.transport, or_dash(e.reason));
        }
    }
    return 0;
}

static int print_all(uct_rs_listing *l)
{
    uct_rs_build_info b;
    if (failed(uct_rs_listing_build(l, &b), "uct_rs_listing_build")) {
        return 1;
    }
    printf("# uct-rs version %s (%s)\n# module ABI fingerprint %s\n# module search path %s\n#\n",
           b.version, b.profile, b.module_abi_fingerprint, or_dash(b.module_search_path));

    printf("# Components\n");
    for (size_t i = 0; i < count(l, UCT_RS_LIST_COMPONENTS); i++) {
        uct_rs_component_entry e;
        if (failed(uct_rs_listing_component(l, i, &e), "uct_rs_listing_component")) {
            return 1;
        }
        printf("#   %-8s %s; transports %s; memory domains %s; from %s%s%s\n", e.name,
               e.description, or_dash(e.transports), or_dash(e.memory_domains), e.origin,
               e.error != NULL ? "; " : "", e.error != NULL ? e.error : "");
    }

    printf("#\n# Modules\n");
    size_t modules = count(l, UCT_RS_LIST_MODULES);
    if (modules == 0) {
        printf("#   (no module file found in the search path)\n");
    }
    for (size_t i = 0; i < modules; i++) {
        uct_rs_module_entry e;
        if (failed(uct_rs_listing_module(l, i, &e), "uct_rs_listing_module")) {
            return 1;
        }
        printf("#   %-8s %s: %s%s%s\n", e.name, e.path, e.status,
               e.reason != NULL ? ": " : "", e.reason != NULL ? e.reason : "");
    }

    printf("#\n# Memory domains\n");
    for (size_t i = 0; i < count(l, UCT_RS_LIST_MEMORY_DOMAINS); i++) {
        uct_rs_memory_domain_entry e;
        if (failed(uct_rs_listing_memory_domain(l, i, &e), "uct_rs_listing_memory_domain")) {
            return 1;
        }
        if (!e.usable) {
            printf("#   %s: no memory domain: %s\n", e.component, or_dash(e.reason));
            continue;
        }
        printf("#   %s (component %s)%s%s\n#     flags %s; allocates %s; registers %s; "
               "detects %s; rkey %zu bytes\n",
               e.name, e.component, e.description != NULL ? ": " : "",
               e.description != NULL ? e.description : "", or_dash(e.flags),
               or_dash(e.alloc_memory_types), or_dash(e.register_memory_types),
               or_dash(e.detect_memory_types), e.rkey_size);
    }

    printf("#\n# Transports\n");
    for (size_t i = 0; i < count(l, UCT_RS_LIST_TRANSPORTS); i++) {
        uct_rs_transport_entry e;
        if (failed(uct_rs_listing_transport(l, i, &e), "uct_rs_listing_transport")) {
            return 1;
        }
        if (e.device == NULL) {
            printf("#   %s: absent: %s\n", e.transport, or_dash(e.reason));
            continue;
        }
        printf("#   %s on %s (%s, memory domain %s)", e.transport, e.device,
               or_dash(e.device_type), or_dash(e.memory_domain));
        if (!e.usable) {
            printf(": %s\n", or_dash(e.reason));
            continue;
        }
        printf("\n#     %s\n#     memory %s; largest zero-copy put %zu bytes; "
               "latency %.0f ns, bandwidth %.0f MB/s\n",
               or_dash(e.capabilities), or_dash(e.memory_types), e.max_put_zcopy,
               e.latency_ns, e.bandwidth_mbps);
    }
    printf("#\n");
    return print_probe(l);
}

int main(int argc, char **argv)
{
    int probe_only = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--probe") == 0) {
            probe_only = 1;
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            printf("usage: " PROG " [--probe]\n\nWhat uct-rs finds here: build, components, "
                   "modules, memory domains,\ntransports. --probe: one line per transport, "
                   "usable or why not.\nUCT_MODULE_DIR adds folders to search for modules "
                   "(libuct_ib.so: rc).\n");
            return 0;
        } else {
            fprintf(stderr, PROG ": unknown argument %s; try --help\n", argv[i]);
            return 2;
        }
    }
    uct_rs_listing *l = NULL;
    if (failed(uct_rs_listing_create(&l), "uct_rs_listing_create")) {
        return 1;
    }
    int rc = probe_only ? print_probe(l) : print_all(l);
    if (failed(uct_rs_listing_free(l), "uct_rs_listing_free")) {
        rc = 1;
    }
    return rc;
}
