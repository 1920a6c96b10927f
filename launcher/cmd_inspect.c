/* PLACEHOLDER while the session builds it: tessera inspect. */
#include "launcher/commands.h"
#include <stdio.h>
int tsr_cmd_inspect(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "tessera inspect: not built yet\n");
    return 1;
}
