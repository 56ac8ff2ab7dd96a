"""Fleet and multi-node tests (issues 17 and 18): "hosts" as network namespaces on one machine."""
