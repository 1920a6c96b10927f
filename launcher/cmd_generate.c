/* PLACEHOLDER while the session builds it: tessera generate. */
#include "launcher/commands.h"
#include <stdio.h>
int tsr_cmd_generate(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "tessera generate: not built yet\n");
    return 1;
}
