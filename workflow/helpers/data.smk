# The corpus files data.smk writes.
def corpus_outputs():
    # A pretrained model's corpus has a training part only for the learned eviction trace.
    trained = EMBEDDED or "trace_sequences" in config["corpus"]
    parts = [f"shard-{shard}" for shard in SHARDS] + (["train"] if trained else [])
    return [f"results/corpus/{part}.parquet" for part in parts]
