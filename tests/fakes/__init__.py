"""What the tests and the demo stand in for the outside world with: a Hugging Face Hub (`hub`,
`repos`), a container registry (`registry`), a tiny model (`tinymodel`), and the sandbox's ports
and labels (`sandbox`). Never shipped: sparkctl itself runs against the real ones."""
