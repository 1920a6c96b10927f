/* PLACEHOLDER while the session builds it: tessera tokenize. */
#include "launcher/commands.h"
#include <stdio.h>
int tsr_cmd_tokenize(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "tessera tokenize: not built yet\n");
    return 1;
}
