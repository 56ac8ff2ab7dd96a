"""The only modules that import docker, python_on_whales and huggingface_hub."""
