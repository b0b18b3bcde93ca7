"""What the tests and the bench share: the collector as a subprocess
(collector_process.py). Both import it from here; neither imports the other's helpers
for it."""
