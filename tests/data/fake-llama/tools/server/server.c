#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--version") == 0) {
        fprintf(stderr, "version: 0.0.0-fake (build 0, commit fake)\n");
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--help") == 0) {
        printf("-ctk,  --cache-type-k TYPE              KV cache data type for K\n");
        printf("                                        allowed values: f16, q8_0\n");
        printf("-ctv,  --cache-type-v TYPE              KV cache data type for V\n");
        printf("                                        allowed values: f16\n");
        printf("--spec-type none,draft-simple\n");
        printf("                                        speculative decoding types\n");
        return 0;
    }
    return 1;
}
