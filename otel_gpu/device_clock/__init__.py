"""Device-clock mode (issue 46): GPU work timed by the device, from the CUPTI injection library
a service loads through CUDA_INJECTION64_PATH (cupti/): its build (library.py), the CUPTI APIs
its records name (apis.py) and the flag file that turns it on (flag.py). The collector's side
of it: bpf/device_records.c and pipeline/device_times.py."""
