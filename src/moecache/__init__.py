"""moecache: expert-cache policies for mixture-of-experts offloading, measured end to end."""

__version__ = "0.1.0"
