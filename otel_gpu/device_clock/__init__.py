"""Device-clock mode (issue 46): GPU activity timed by the device, from the CUPTI injection
library a service loads through CUDA_INJECTION64_PATH (cupti/). Today: the library and its
build, tested against a fake CUPTI; the collector does not probe its hand-off yet."""
