"""A simulated vLLM engine: the same command line and HTTP API, speeds from the seed studies.

Stands in for a GPU engine in the demo and in fault and speed tests. Runs inside the
`sparkctl-sim` image (entrypoint `vllm`) and imports nothing else from sparkctl.
"""
