/* PLACEHOLDER while the session builds it: tessera logits. */
#include "launcher/commands.h"
#include <stdio.h>
int tsr_cmd_logits(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "tessera logits: not built yet\n");
    return 1;
}
