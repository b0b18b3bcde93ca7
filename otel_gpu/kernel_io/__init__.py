"""The kernel's output, read in user space: the owner of the loaded BPF program and its
maps (program.py), the ring-buffer and map readers (reader.py, launch_slots.py,
map_batch.py), the ctypes mirror of bpf/events.h (abi.py) and the decoder that turns
its records into otel_gpu.records (decode.py). Upstream of the pipeline: the pipeline
never imports it, it imports nothing of the pipeline."""
