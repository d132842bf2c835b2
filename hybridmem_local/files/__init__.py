"""Files in and out: session readers (LoCoMo, JSONL, exports), JSON/YAML readers whose errors
name the file and place, and the owner-only, crash-safe writes beside the store."""
