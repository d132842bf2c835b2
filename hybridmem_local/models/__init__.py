"""Model files: the manifest (``manifest.yaml``), resolving a model name to local files,
verifying, bundling and installing them, and the offline mode every model load goes through."""
