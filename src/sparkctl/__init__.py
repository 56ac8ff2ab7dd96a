"""sparkctl: deploy and run LLM serving stacks on NVIDIA DGX Spark."""

__version__ = "0.2.0"
