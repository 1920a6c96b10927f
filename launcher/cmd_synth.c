/* PLACEHOLDER while the session builds it: tessera synth. */
#include "launcher/commands.h"
#include <stdio.h>
int tsr_cmd_synth(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "tessera synth: not built yet\n");
    return 1;
}
