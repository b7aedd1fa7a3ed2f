"""Models: device and dtype resolution, loading, LoRA and merged weights (loading.py); the offline tiny model
and tokenizer (tiny.py)."""
