/* A module linked against a library that is not installed: the loader
 * must report the missing dependency by name. */
extern int uct_ghost_function(void);

int uct_module_abi(void) { return uct_ghost_function(); }
