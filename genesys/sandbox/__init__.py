"""Code sandboxes: one interface (`Sandbox`), three backends (docker, bwrap, subprocess)."""
