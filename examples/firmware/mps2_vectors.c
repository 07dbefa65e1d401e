/* The two words a Cortex-M reads at reset, for QEMU's mps2-an386 board
 * (docs/lm_on_device.md runs lm_main.cc there): the initial stack pointer,
 * the top of the board's 4 MB of SSRAM at 0, and the reset handler, newlib's
 * semihosting start-up `_start` (rdimon.specs). Link it at address 0:
 * -Wl,--section-start=.vectors=0x0. A real board brings its own start-up
 * file and linker script instead. */
extern void _start(void);

__attribute__((section(".vectors"), used)) void (*const g_vectors[2])(void) = {
    (void (*)(void))0x003FFFF0, /* initial stack pointer */
    _start,                     /* reset */
};
