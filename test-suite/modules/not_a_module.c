/* A shared library without the uct_module_abi symbol. */
int something_else(void) { return 42; }
