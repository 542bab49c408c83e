"""The text: corpus (training part and held-out shards) and the embedded tokenizer."""
