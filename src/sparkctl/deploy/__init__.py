"""The deploy pipeline: image, weights, patches, container, health; and what it records."""
