"""Stack and patch-set specs: models, loading (with `extends`), and rendering."""
