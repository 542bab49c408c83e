"""Typed records of what the stages exchange, and the files that carry them: frozen,
versioned dataclasses, read and written only through their modules here, and the one
function that counts a pool's copies (counting.py). No torch."""
