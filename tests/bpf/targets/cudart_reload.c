/* One process, three libcudart lifetimes: dlopen(A) + K1 launches, dlclose(A);
 * dlopen(A) again + K2 launches, dlclose(A); dlopen(B) (a copy of A under another
 * path and name) + K3 launches. argv: A B K1 K2 K3. Steps are gated on stdin lines
 * so the test can wait for the collector to probe a new file; progress goes to
 * stderr ("listening on 0" first, for the test harness's Target). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct { unsigned x, y, z; } dim3;
typedef int (*launch_fn)(const void *, dim3, dim3, void **, size_t, void *);

static void wait_line(void)
{
    char buf[64];
    if (!fgets(buf, sizeof(buf), stdin))
        exit(3);
}

static void *load_and_launch(const char *path, int k, const char *tag)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
        exit(1);
    }
    fprintf(stderr, "loaded %s\n", tag);
    wait_line();
    launch_fn launch = (launch_fn)dlsym(h, "cudaLaunchKernel");
    dim3 grid = {9, 1, 1}, block = {16, 1, 1};
    for (int i = 0; i < k; i++)
        launch((const void *)load_and_launch, grid, block, NULL, 0, NULL);
    fprintf(stderr, "launched %s %d\n", tag, k);
    return h;
}

int main(int argc, char **argv)
{
    if (argc < 6)
        return 2;
    fprintf(stderr, "listening on 0\n");
    wait_line();
    void *h = load_and_launch(argv[1], atoi(argv[3]), "first");
    fprintf(stderr, "dlclose first -> %d\n", dlclose(h));
    h = load_and_launch(argv[1], atoi(argv[4]), "again");
    fprintf(stderr, "dlclose again -> %d\n", dlclose(h));
    load_and_launch(argv[2], atoi(argv[5]), "copy");
    wait_line();
    return 0;
}
