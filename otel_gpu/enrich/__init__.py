"""The enrich stage (stage.py): what a request's and a window's spans say beyond the
stitcher's records: the process's Resource (resources.py: service, process, container,
Kubernetes pod), the route template of each path (routes.py), the kernels' names
(symbols.py). Downstream of the pipeline's stitching, upstream of cost and export."""
