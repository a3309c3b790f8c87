/* What one PAUSE costs, on the host and in the rc testbed's VM (an
 * experiment, never shipped; docs/perf-rc-notes.md, "PAUSE under the
 * emulator"). In one run, 5 samples of each: 256 PAUSEs in a loop (the
 * figures the notes quote), 32 in a loop, 32 in a row without a loop,
 * and an empty sample (the clock's two reads, not taken off the
 * others). Per PAUSE, in ns, clock included.
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

static double in_loop(volatile int n)
{
    double t = now_ns();
    for (int i = 0; i < n; i++)
        __builtin_ia32_pause();
    return now_ns() - t;
}

static double in_a_row(void)
{
    double t = now_ns();
    __asm__ volatile(".rept 32\n\tpause\n\t.endr" ::: "memory");
    return now_ns() - t;
}

int main(void)
{
    for (int r = 0; r < 5; r++)
        printf("pause %.1f ns each (256 in a loop); 32 in a loop %.1f; 32 in a row %.1f; clock pair %.0f ns\n",
               in_loop(256) / 256, in_loop(32) / 32, in_a_row() / 32, in_loop(0));
    return 0;
}
