"""Typed records: what the stages exchange, and the one function that counts a pool's
copies (counting.py). No torch import."""
