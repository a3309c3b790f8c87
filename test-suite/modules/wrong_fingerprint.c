/* A module whose ABI descriptor is well formed but built for another
 * compiler: the host must refuse it after reading the descriptor and before
 * calling anything else (this file has no uct_module_init at all). */
#include <stdint.h>

struct uct_module_abi {
    uint64_t magic;
    uint32_t abi_version;
    const char *fingerprint;
};

static const struct uct_module_abi abi = {
    .magic = 0x0100444f4d544355ULL, /* "UCTMOD\0\x01" little-endian */
    .abi_version = 1,
    .fingerprint = "uct-core 0.0.1+src.0000000000000000; rustc 1.0.0 (a28077b28 2015-05-13); x86_64-unknown-linux-gnu; debug",
};

const struct uct_module_abi *uct_module_abi(void) { return &abi; }
