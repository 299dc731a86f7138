"""One module per command: the workflows that cli/ calls (they build on core, generators and loaders)."""
