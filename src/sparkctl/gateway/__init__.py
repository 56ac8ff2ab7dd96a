"""The gateway: the stable OpenAI-compatible endpoint agents talk to, in front of the stacks."""
