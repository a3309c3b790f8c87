/* The dependency of needs_missing_lib.c; built, linked against, deleted. */
int uct_ghost_function(void) { return 0; }
