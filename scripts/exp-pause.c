/* What one PAUSE costs, on the host and in the rc testbed's VM (an
 * experiment, never shipped; docs/perf-rc-notes.md, "PAUSE under the
 * emulator"). Five batches of 256 PAUSEs, each timed with
 * CLOCK_MONOTONIC, in one run.
 *   cc -O2 -o target/exp-pause scripts/exp-pause.c
 *   target/exp-pause; scripts/rxe-vm -- target/exp-pause */
#include <stdio.h>
#include <time.h>

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(void)
{
    for (int r = 0; r < 5; r++) {
        double t = now_ns();
        for (int i = 0; i < 256; i++)
            __builtin_ia32_pause();
        printf("pause %.1f ns each\n", (now_ns() - t) / 256);
    }
    return 0;
}
