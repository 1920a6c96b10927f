/* PLACEHOLDER while the session builds it: tessera bench. */
#include "launcher/commands.h"
#include <stdio.h>
int tsr_cmd_bench(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "tessera bench: not built yet\n");
    return 1;
}
