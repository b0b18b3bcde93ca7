"""What the tests and the bench share: the collector as a subprocess
(collector_process.py), the real OTLP/gRPC and OTLP/HTTP receivers the collector exports
to (otlp_receiver.py), and the bench's counting one (counting_receiver.py). Both import
them from here; neither imports the other's helpers for them."""
